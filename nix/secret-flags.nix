# Does a list of command-line arguments carry a secret flag (limits.json secretFlags)?
# Pure, builtins + lib only. The modules assert on it at evaluation time: the build-time
# validator refuses the same, but only after the config (and the key) is in the Nix store,
# which every local user can read. Abbreviations count, as SGLang's and smg's argparse
# accept them (`--api-k=x` is `--api-key=x`), the same rule as sglang_dflash.config.
{ lib }:
secrets: args:
let
  flagOf = a: lib.head (lib.splitString "=" a);
  secret = f: lib.any (s: f == s || (lib.stringLength f > 2 && lib.hasPrefix "--" f && lib.hasPrefix f s)) secrets;
in
lib.filter secret (map flagOf args)
