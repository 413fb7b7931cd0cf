# nixpkgs/maintainers/maintainer-list.nix: lib.maintainers reads it; nixpkgs.lib ships without it.
{ }
