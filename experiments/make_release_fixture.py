"""Makes tests/interop/fixtures/release_default/ with the authors' T²MLR release's own code.
What it runs, t2mlr_jax/studies/fixtures/t2mlr_release.py, imports only the stdlib on import: the release's
Python runs it too."""

from t2mlr_jax.studies.fixtures.t2mlr_release import main

if __name__ == "__main__":
    main()
