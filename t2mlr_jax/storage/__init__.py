"""What a run leaves on disk: its workdir's layout and session record, the one-writer lock, and the
checkpoints (the only code that talks to orbax). Both training and interop read and write through it."""
