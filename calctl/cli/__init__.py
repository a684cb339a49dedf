"""The calctl command line: one module per noun, registered in :mod:`calctl.cli.app`."""
