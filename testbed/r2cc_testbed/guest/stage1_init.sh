#!/bin/sh
# The guest's first init (in the busybox initramfs): load what mounting the host needs, put the
# host's root (read-only, virtio-9p) under a tmpfs overlay, mount the run's writable share, and
# hand over to the run's own init there. Any failure powers off at once (the host then reports).
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
fail() { echo "r2cc-guest: stage1 failed: $*"; poweroff -f; }
for m in $(cat /mods/order); do insmod "/mods/$m" || fail "insmod $m"; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot /lower || fail "mount hostroot"
mount -t tmpfs -o size=2g tmpfs /upper && mkdir -p /upper/u /upper/w || fail "tmpfs"
mount -t overlay overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w /newroot || fail "overlay"
mkdir -p /newroot/r2cc-out
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 r2ccout /newroot/r2cc-out || fail "mount r2ccout"
[ -f /newroot/r2cc-out/.job/init.sh ] || fail "no .job/init.sh on the share"
umount /proc /sys /dev
exec switch_root /newroot /bin/bash /r2cc-out/.job/init.sh
