"""Train a small Qwen3 target and its DFlash drafter from local text, save them in the formats
SGLang 0.5.17 loads, and measure the drafter's offline accept length (linear DFlash and DDTree).

Modules, one job each: ``config`` (sizes and step plans), ``corpus`` (stdlib sources, split),
``tokenizer`` (BPE), ``target`` (Qwen3 target training), ``drafter`` (DFlash draft model, the
math of SGLang's ``DFlashDraftModel``), ``generate`` (greedy continuations and target features),
``train_drafter``, ``evaluate`` (simulated decoding), ``checkpoint`` (on-disk formats), ``train``
(the CLI). Heavy imports (torch, tokenizers, transformers) happen inside the modules that need
them, so ``import benchmarks.real_drafter`` stays cheap.
"""
