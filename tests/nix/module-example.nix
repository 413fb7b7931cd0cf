# The two-instance example the module-eval check renders (see pkgs/checks/module-eval.nix):
# a DFlash server on GPU 0 without preflight, a DDTree server on GPU 1 with its port open.
{
  services.sglang-dflash.instances = {
    small = {
      model = "Qwen/Qwen3-8B";
      draftModel = "z-lab/Qwen3-8B-DFlash-b16";
      algorithm = "dflash";
      gpus = [ 0 ];
      port = 30000;
      preflight = false;
    };
    tree = {
      model = "Qwen/Qwen3-8B";
      draftModel = "z-lab/Qwen3-8B-DFlash-b16";
      algorithm = "ddtree";
      ddtree.budget = 64;
      gpus = [ 1 ];
      port = 30001;
      openFirewall = true;
      preflight = true;
    };
  };
}
