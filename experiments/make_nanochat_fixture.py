"""Makes tests/interop/fixtures/lrt_release_vanilla/ with the LRT release's own code; with `muon` first
(`python -m experiments.make_nanochat_fixture muon --help`), tests/train/fixtures/nanochat_muon/: its
MuonAdamW's steps. What it runs, t2mlr_jax/studies/fixtures/nanochat.py (or nanochat_muon.py), imports only
the stdlib on import: the release's Python runs it too."""

import sys

from t2mlr_jax.studies.fixtures import nanochat, nanochat_muon

if __name__ == "__main__":
    if sys.argv[1:2] == [nanochat_muon.SUBCOMMAND]:
        nanochat_muon.main(sys.argv[2:])
    else:
        nanochat.main()
