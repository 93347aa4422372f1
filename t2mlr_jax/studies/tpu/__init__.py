"""TPU pods compiled from this CPU (experiments/tpu_scaling.py): the studies' rows (rows.py), each one
tools/aot_compile.py run (scaling.py), and the tables of their reports (tables.py)."""
