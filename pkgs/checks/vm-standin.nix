# A NixOS VM boots with services.sglang-dflash and one DDTree instance whose package is the
# SGLang stand-in (tests/standin: the same HTTP surface, no GPU), and asserts on the unit the
# module rendered as systemd runs it: notify readiness, the status line, the hardening,
# `check --url`, a clean stop although the stand-in SIGKILLs itself as SGLang 0.5.17 does.
# The same assertions run on the CPU machine against the unit `sglang-dflash unit` renders
# (tests/systemd_unit/test_systemd_boot.py, a real systemd in namespaces); this is the module's copy.
# Written and parsed here (Nix 2.8); NOT yet run: it needs Nix >= 2.18 and KVM.
{
  lib,
  pkgs,
  src,
  nixosModule,
}:
let
  # `package` of the instance: bin/sglang-dflash running this source's CLI with the
  # stand-in first on PYTHONPATH, so `serve` starts it as `python -m sglang.launch_server`.
  standin = pkgs.writeShellScriptBin "sglang-dflash" ''
    export PYTHONPATH=${src}/tests/standin:${src}/src
    exec ${pkgs.python3}/bin/python3 -m sglang_dflash.cli "$@"
  '';
in
pkgs.testers.runNixOSTest {
  name = "sglang-dflash-standin";
  nodes.machine = {
    imports = [ nixosModule ];
    environment.systemPackages = [ standin pkgs.curl ];
    services.sglang-dflash.instances.standin = import ./vm-standin-instance.nix standin;
  };
  testScript = ''
    unit = "sglang-dflash-standin.service"
    machine.wait_for_unit(unit)
    props = machine.succeed(f"systemctl show -p Type,ActiveState,SubState,StatusText,DynamicUser,ProtectSystem,PrivateTmp {unit}")
    for want in ("Type=notify", "ActiveState=active", "SubState=running", "DynamicUser=yes",
                 "ProtectSystem=strict", "PrivateTmp=yes",
                 "StatusText=serving Qwen/Qwen3-8B (ddtree) on 127.0.0.1:30000"):
        assert want in props, f"{want!r} not in {props!r}"
    machine.succeed("curl -sf http://127.0.0.1:30000/health")
    machine.succeed("sglang-dflash check --url http://127.0.0.1:30000 --layer live "
                    "--expect-algorithm ddtree --expect-ddtree-budget 16")
    machine.succeed(f"systemctl stop {unit}")
    result = machine.succeed(f"systemctl show -p Result,ExecMainStatus {unit}")
    assert "Result=success" in result and "ExecMainStatus=0" in result, result
  '';
}
