# The instance the VM test (vm-standin.nix) runs, as a function of its package; also evaluated
# at lib level by tests/module/test_module.py::test_vm_test_instance_renders_the_expected_unit.
package: {
  inherit package;
  model = "Qwen/Qwen3-8B";
  draftModel = "z-lab/Qwen3-8B-DFlash-b16";
  algorithm = "ddtree";
  ddtree.budget = 16;
  port = 30000;
  preflight = false; # the package layer would (rightly) find no SGLang in the stand-in
  environment = {
    STANDIN_SELFKILL_ON_TERM = "1";
    STANDIN_TOKEN_DELAY = "0";
  };
}
