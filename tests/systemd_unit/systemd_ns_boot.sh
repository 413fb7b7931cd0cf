#!/bin/bash
# Boots a throwaway systemd as PID 1 of new PID/mount/UTS/IPC/network namespaces for
# tests/systemd_unit/test_systemd_boot.py. Usage (as root): unshare --pid --fork --mount --uts --ipc --net
# --mount-proc systemd_ns_boot.sh <test-dir> <repo>   (the test renders its units inside)
#
# Isolation first, because a system manager touches the host where it can: on 2026-12-02 a first
# attempt without it let the service's default dependencies pull in sysinit.target, whose
# systemd-tmpfiles-setup.service emptied the host's /tmp. So, before systemd starts:
# - every mount made here is private to this namespace (unshare's default propagation), and
#   every directory systemd or its units write to is a fresh tmpfs or a private copy:
#   /run, /tmp, /var/{tmp,lib,log,cache,spool}, /srv, /etc;
# - every unit any *.wants/*.requires directory would pull in is masked, except journald, so
#   sysinit.target, basic.target and friends start nothing;
# - the test files are bind-mounted under /srv (outside /tmp: the unit has PrivateTmp=true).
set -euo pipefail
testdir=$1 repo=$2

mount --make-rprivate /
# the test files first: they may live under /tmp, which is covered next
mount -t tmpfs -o mode=0755 tmpfs /srv
mkdir -p /srv/t /srv/repo && mount --bind "$testdir" /srv/t && mount --bind "$repo" /srv/repo
for d in /run /tmp /var/tmp /var/lib /var/log /var/cache /var/spool; do
    mkdir -p "$d" && mount -t tmpfs -o mode=0755 tmpfs "$d"
done
chmod 1777 /tmp /var/tmp
mkdir -p /run/ns-etc && cp -a /etc/. /run/ns-etc/ && mount --bind /run/ns-etc /etc

mkdir -p /run/systemd/system
keep="systemd-journald.service systemd-journald.socket systemd-journald-dev-log.socket"
for wants in /lib/systemd/system/*.wants /lib/systemd/system/*.requires \
    /etc/systemd/system/*.wants /etc/systemd/system/*.requires; do
    [ -d "$wants" ] || continue
    for u in "$wants"/*; do
        name=$(basename "$u")
        case " $keep " in *" $name "*) continue ;; esac
        [ -e "/run/systemd/system/$name" ] || ln -s /dev/null "/run/systemd/system/$name"
    done
done
# and, wherever they would come from, the units that act on the kernel or on shared state
for name in modprobe@.service kmod-static-nodes.service systemd-modules-load.service \
    systemd-sysctl.service systemd-tmpfiles-setup.service systemd-tmpfiles-setup-dev.service \
    systemd-tmpfiles-setup-dev-early.service systemd-tmpfiles-clean.service \
    systemd-tmpfiles-clean.timer systemd-sysusers.service systemd-udevd.service \
    systemd-udev-trigger.service systemd-random-seed.service systemd-remount-fs.service \
    systemd-binfmt.service proc-sys-fs-binfmt_misc.automount systemd-firstboot.service \
    systemd-machine-id-commit.service systemd-hwdb-update.service systemd-pstore.service \
    systemd-boot-update.service ldconfig.service sys-kernel-config.mount \
    sys-kernel-tracing.mount sys-kernel-debug.mount dev-hugepages.mount; do
    [ -e "/run/systemd/system/$name" ] || ln -s /dev/null "/run/systemd/system/$name"
done
printf '[Unit]\nDescription=sglang-dflash systemd test target\n' > /run/systemd/system/sgltest.target
exec /lib/systemd/systemd --system --unit=sgltest.target --log-target=journal --log-level=notice
