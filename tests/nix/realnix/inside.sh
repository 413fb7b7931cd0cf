#!/usr/bin/env bash
# Runs inside the Debian 13 root (see run.sh). Every command is offline: no substituters,
# every input a path: override. Each command's stdout/stderr goes to /h/out/<step>.{out,err}.
set -uo pipefail
cd /h/src
nix --version > /h/out/nix-version.out
O=(--offline --no-write-lock-file
   --override-input nixpkgs path:/h/nixpkgs
   --override-input uv2nix path:/h/uv2nix
   --override-input pyproject-nix path:/h/pyproject-nix
   --override-input pyproject-build-systems path:/h/build-system-pkgs)
S=x86_64-linux
fails=0
step() {  # name, command...
  local name=$1; shift
  if "$@" > "/h/out/$name.out" 2> "/h/out/$name.err"; then echo "PASS $name"
  else echo "FAIL $name: $(grep -m3 -E 'error|rror:' "/h/out/$name.err" | tr '\n' ' ')"; fails=$((fails+1)); fi
}
step metadata nix flake metadata --json "${O[@]}" .
step show nix flake show --json "${O[@]}" .
step check nix flake check --no-build --keep-going "${O[@]}" .
for a in $(nix eval --json "${O[@]}" .#packages.$S --apply builtins.attrNames 2>/dev/null | tr -d '[]"' | tr , ' '); do
  step "drv-package-$a" nix eval --raw "${O[@]}" ".#packages.$S.$a.drvPath"
done
step pins nix eval --json "${O[@]}" ".#packages.$S.sglang-dflash.passthru.pins"
step drv-devshell nix eval --raw "${O[@]}" ".#devShells.$S.default.drvPath"
for c in $(nix eval --json "${O[@]}" .#checks.$S --apply builtins.attrNames 2>/dev/null | tr -d '[]"' | tr , ' '); do
  step "drv-check-$c" nix eval --raw "${O[@]}" ".#checks.$S.$c.drvPath"
done
for a in $(nix eval --json "${O[@]}" .#apps.$S --apply builtins.attrNames 2>/dev/null | tr -d '[]"' | tr , ' '); do
  step "app-$a" nix eval --raw "${O[@]}" ".#apps.$S.$a.program"
done
step drv-formatter nix eval --raw "${O[@]}" ".#formatter.$S.drvPath"
step dry-run nix build --dry-run "${O[@]}" .#sglang-dflash
step fetches bash -c "nix derivation show -r $(printf '%q ' "${O[@]}") .#sglang-dflash"
for t in uv2nix pyproject-nix build-system-pkgs; do
  step "hash-$t" nix hash path "/h/$t"
done
# nixpkgs: the exported nixpkgs.lib tree, and the lib/ the flake evaluates (inside the stand-in)
step hash-nixpkgs-lib nix hash path /h/nixpkgs.lib
step hash-nixpkgs-lib-dir nix hash path /h/nixpkgs/lib
# NixOS-style module evaluations (tests/nix/realnix/module-case.nix); the failing cases are
# expected to fail: their stderr is the result the pytest wrapper reads.
for c in two-instances same-port same-gpu gpu-twice bad-port bad-algorithm bad-budget bad-name \
    misspelt-option scale-out bad-router-name bad-dist-addr inline-key; do
  nix-instantiate --eval --strict --json /h/src/tests/nix/realnix/module-case.nix \
    --arg standin /h/nixpkgs --arg src /h/src --argstr case "$c" \
    > "/h/out/module-$c.out" 2> "/h/out/module-$c.err"; echo "module case $c: rc=$?"
done
echo "fails=$fails"
exit $((fails > 0))
