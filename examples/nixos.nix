# A NixOS host with two DFlash/DDTree servers on one 4-GPU machine, and a baseline.
# Import the flake's nixosModules.default (it adds pkgs.sglang-dflash) next to this file.
{
  services.sglang-dflash.instances = {
    qwen3-8b-ddtree = {
      model = "Qwen/Qwen3-8B";
      draftModel = "z-lab/Qwen3-8B-DFlash-b16";
      algorithm = "ddtree";
      ddtree.budget = 64;
      ddtree.policy = "adaptive";        # smaller trees or no draft where N = 64 does not pay
      gpus = [ 0 1 ];                    # tensor parallel 2 (the default: one rank per GPU)
      port = 30000;
      memFractionStatic = 0.8;
      attentionBackend = "flashinfer";
      servedModelName = "qwen3-8b";
      apiKeyFile = "/run/secrets/sglang-api-key";  # root-only file; handed over by systemd
      environmentFile = "/run/secrets/hf-token";    # HF_TOKEN=...
      openFirewall = true;
      host = "0.0.0.0";
    };
    qwen3-8b-dflash = {
      model = "Qwen/Qwen3-8B";
      draftModel = "z-lab/Qwen3-8B-DFlash-b16";
      algorithm = "dflash";
      gpus = [ 2 ];
      port = 30001;
    };
    qwen3-8b-baseline = {
      model = "Qwen/Qwen3-8B";
      algorithm = "none";
      gpus = [ 3 ];
      port = 30002;
    };
  };
}
