# nixpkgs/maintainers/computed-team-list.nix: lib.teams reads it; nixpkgs.lib ships without it.
{ ... }: { }
