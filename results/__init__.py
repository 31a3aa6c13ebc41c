"""Results schema and run-directory I/O."""
