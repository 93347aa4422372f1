"""What one of the T²MLR release's training scripts really runs, as a JSON fixture.
What it runs, t2mlr_jax/studies/fixtures/release_args.py, imports only the stdlib on import: the release's
Python runs it too."""

from t2mlr_jax.studies.fixtures.release_args import main

if __name__ == "__main__":
    main()
