"""`sglang-dflash bench`: measure a server, or sweep server configurations, over HTTP."""
