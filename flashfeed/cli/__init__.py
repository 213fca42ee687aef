"""The ``flashfeed`` command (``main``) and the commands of the core: store, dataset."""
