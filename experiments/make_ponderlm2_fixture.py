"""Makes tests/interop/fixtures/ponderlm2_release/ with PonderLM-2's release's own code.
What it runs, t2mlr_jax/studies/fixtures/ponderlm2.py, imports only the stdlib on import: the release's
Python runs it too."""

from t2mlr_jax.studies.fixtures.ponderlm2 import main

if __name__ == "__main__":
    main()
