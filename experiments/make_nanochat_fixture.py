"""Makes tests/interop/fixtures/lrt_release_vanilla/ with the LRT release's own code.
What it runs, t2mlr_jax/studies/fixtures/nanochat.py, imports only the stdlib on import: the release's
Python runs it too."""

from t2mlr_jax.studies.fixtures.nanochat import main

if __name__ == "__main__":
    main()
