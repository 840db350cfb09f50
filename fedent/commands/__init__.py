"""CLI subcommands of the core (each module exposes ``add_parser(subparsers)`` and ``run(args) -> int``)."""
