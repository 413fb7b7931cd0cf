"""The benchmark behind `sglang-dflash bench`: measure a server, or sweep server configurations,
over HTTP (the flags are `sglang_dflash.commands.bench`)."""
