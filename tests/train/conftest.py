from absl import flags

flags.FLAGS.mark_as_parsed()  # grain reads absl flags
