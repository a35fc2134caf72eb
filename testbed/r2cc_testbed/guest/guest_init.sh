#!/bin/bash
# The guest's init after switch_root (root: the host's / read-only under a tmpfs overlay; the
# run's share at /r2cc-out). It sets up the system, the kernel's RDMA and the rails, runs the
# job's command in the checkout (or a shell) and powers off. Lines "r2cc-guest: ..." are for the host.
J=/r2cc-out/.job
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts; mount -t tmpfs tmpfs /dev/shm
hostname r2cc-guest
off() { sync; echo o > /proc/sysrq-trigger; sleep 30 2>/dev/null; }  # sleep may be gone with the host
echo "r2cc-guest: up uptime=$(cut -d' ' -f1 /proc/uptime)"
source $J/job.env || { echo "r2cc-guest: no job.env"; off; }
# Fresh /run and /tmp, unless the checkout lives there (a clone in /tmp): a tmpfs would hide it.
# The overlay keeps either writable anyway.
for d in /run /tmp; do
    case "$GUEST_CHECKOUT/" in "$d"/*) ;; *) mount -t tmpfs tmpfs "$d" ;; esac
done
mkdir -p /run/netns

# The guest kernel's modules live in the cache (the host's /lib/modules is for another kernel).
mkdir -p /lib/modules && ln -sfn "$GUEST_MODULES" "/lib/modules/$(uname -r)"
# The portable core in place of the host's (-march=native) build, in this overlay only.
rm -f "$GUEST_CHECKOUT"/r2cc_serve/_C.*.so && ln -s "$GUEST_CORE_SO" "$GUEST_CHECKOUT/r2cc_serve/"
ip link set lo up

bash $J/rails.sh $J/rails.env > $J/rails.log 2>&1; rails_rc=$?
cat $J/rails.log
set -a; source $J/rails.env; set +a
cd "$GUEST_CHECKOUT"
export PATH="$GUEST_PATH_PREFIX:$PATH" PYTHONPATH="$GUEST_PYTHONPATH" R2CC_GUEST_OUT=/r2cc-out \
    R2CC_GUEST_CORE="$GUEST_CORE_SO"

if grep -qw r2cc.shell=1 /proc/cmdline; then
    [ $rails_rc = 0 ] || echo "r2cc-guest: rails failed rc=$rails_rc (a shell anyway)"
    echo "r2cc-guest: shell (exit or Ctrl-D powers off)"
    setsid bash -c 'exec bash -i </dev/ttyS0 >/dev/ttyS0 2>&1'
    off
fi
if [ $rails_rc != 0 ]; then
    echo "r2cc-guest: rails failed rc=$rails_rc"; echo 125 > $J/rc; off
fi
echo "r2cc-guest: command start uptime=$(cut -d' ' -f1 /proc/uptime)"
timeout -k 5 "$GUEST_TIMEOUT_S" bash $J/command.sh < /dev/null 2>&1 | tee $J/output.log
rc=${PIPESTATUS[0]}
echo $rc > $J/rc
echo "r2cc-guest: command end rc=$rc uptime=$(cut -d' ' -f1 /proc/uptime)"
off
