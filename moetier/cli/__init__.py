"""The command line: argument parsing and presentation only; the work happens in the layers below."""
