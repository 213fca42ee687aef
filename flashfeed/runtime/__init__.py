"""Process plumbing: children that die with their parent, interrupts, scratch dirs, lazy imports."""
