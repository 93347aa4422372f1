"""Makes tests/interop/fixtures/nanochat_release/ with karpathy/nanochat's own code.
What it runs, t2mlr_jax/studies/fixtures/karpathy_nanochat.py, imports only the stdlib on import: the
release's Python runs it too."""

from t2mlr_jax.studies.fixtures.karpathy_nanochat import main

if __name__ == "__main__":
    main()
