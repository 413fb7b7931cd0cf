"""The subcommands of `sglang-dflash`, one module each.

A command module holds `add_arguments(parser)` and `run(args) -> int` and nothing else of
substance: it turns flags into calls to the library modules (`sglang_dflash.check`,
`.serve`, `.unit`, `.bench`, `.manifest`, `.pins`, `.config`) and raises
`sglang_dflash.errors.UserError` for bad input, which `sglang_dflash.cli.main` reports.
Library modules never import from here.
"""
