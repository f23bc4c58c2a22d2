"""What the experiments share (see :mod:`attnlab.lab`)."""
