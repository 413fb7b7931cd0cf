"""The verification behind `sglang-dflash check`: the package, its ABI, the GPUs, a live server.

Layers (package, abi, gpu, live) each return typed `Result`s; `sglang_dflash.commands.check`
runs the chosen layers and renders them. Nothing here imports sglang or torch in-process.
"""
