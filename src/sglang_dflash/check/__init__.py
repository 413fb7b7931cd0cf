"""`sglang-dflash check`: verify the package, its ABI, the GPUs and a live server.

Layers (package, abi, gpu, live) each return typed `Result`s; `command` runs the
chosen layers and renders them. Nothing here imports sglang or torch in-process.
"""
