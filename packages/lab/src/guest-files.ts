// The files of the guest's root that the lab writes itself (the rest is copied from Debian's packages).

/** Mount tags of the VMs' virtio-9p shares: read-only, from the host. */
export const GUEST_SHARE = 'guest';
export const CONFIG_SHARE = 'config';
/** Where the guest sees the shared node binary and test agent. */
export const GUEST_DIR = '/opt/guest';

/** Kernel modules the guest loads at boot, with their dependencies (found in modules.dep). */
export const GUEST_MODULES = ['virtio_pci', 'virtio_net', 'virtio_blk', '9pnet_virtio', '9p', 'button', 'evdev'];

/**
 * busybox's init: /etc/rc once, sshd kept running; `poweroff` and `reboot`
 * (and ACPI's power button, through acpid) stop it cleanly.
 */
const INITTAB = `::sysinit:/etc/rc
::respawn:/usr/sbin/sshd -D -e
::once:/etc/network-up
::respawn:/bin/acpid -f -c /etc/acpi -l /run/acpid.log
::ctrlaltdel:/bin/reboot
::shutdown:/bin/sync
`;

/**
 * Mounts, modules, the two 9p shares, the per-VM configuration (host key,
 * authorized key, host name) and slirp's fixed addresses. The boot ID goes
 * to the console so the lab's log shows each boot.
 */
const RC = `#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=0755 tmpfs /run
mount -t tmpfs -o mode=1777 tmpfs /tmp
while read -r module; do insmod "/lib/modules/$module"; done < /etc/modules
mkdir -p /run/sshd /run/lab ${GUEST_DIR} /mnt/config
chmod 0700 /run/lab
mount -t 9p -o trans=virtio,version=9p2000.L,ro ${GUEST_SHARE} ${GUEST_DIR}
mount -t 9p -o trans=virtio,version=9p2000.L,ro ${CONFIG_SHARE} /mnt/config
cp /mnt/config/* /run/lab/
chmod 0600 /run/lab/*
hostname "$(cat /run/lab/hostname)"
ip link set lo up
echo "lab: $(hostname) booted, boot ID $(cat /proc/sys/kernel/random/boot_id)" > /dev/console
`;

/**
 * The network comes up once sshd listens: slirp forwards a connection to
 * the guest as soon as it is made, and a guest with its address but no
 * sshd yet answers it with a reset, which the initializer takes for a
 * failed start (and backs off for minutes). Before the address exists, the
 * connection waits instead.
 */
const NETWORK_UP = `#!/bin/sh
for i in $(seq 1 300); do netstat -ltn | grep -q ':22 ' && break; usleep 100000; done
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
`;

const SSHD_CONFIG = `Port 22
HostKey /run/lab/ssh_host_ed25519_key
AuthorizedKeysFile /run/lab/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
UseDNS no
StrictModes no
PidFile /run/sshd.pid
Subsystem sftp /usr/lib/openssh/sftp-server
`;

/** The written files: path, text, mode. */
export function guestFiles(moduleOrder: readonly string[]): Array<{ path: string; text: string; mode: number }> {
  return [
    { path: '/etc/inittab', text: INITTAB, mode: 0o644 },
    { path: '/etc/rc', text: RC, mode: 0o755 },
    { path: '/etc/network-up', text: NETWORK_UP, mode: 0o755 },
    { path: '/etc/modules', text: `${moduleOrder.join('\n')}\n`, mode: 0o644 },
    { path: '/etc/ssh/sshd_config', text: SSHD_CONFIG, mode: 0o644 },
    {
      path: '/etc/passwd',
      text: 'root:x:0:0:root:/root:/bin/sh\nsshd:x:100:65534::/run/sshd:/bin/false\n',
      mode: 0o644,
    },
    { path: '/etc/group', text: 'root:x:0:\nnogroup:x:65534:\n', mode: 0o644 },
    { path: '/etc/shadow', text: 'root:*:19000:0:99999:7:::\nsshd:*:19000:0:99999:7:::\n', mode: 0o600 },
    { path: '/etc/nsswitch.conf', text: 'passwd: files\ngroup: files\nshadow: files\nhosts: files\n', mode: 0o644 },
    { path: '/etc/hosts', text: '127.0.0.1 localhost\n10.0.2.2 host\n', mode: 0o644 },
    { path: '/etc/profile', text: 'export PATH=/bin:/sbin:/usr/bin:/usr/sbin\n', mode: 0o644 },
    // busybox acpid: the power button (QEMU's system_powerdown) powers the guest off.
    { path: '/etc/acpi/PWRF/00000080', text: '#!/bin/sh\nexec /bin/poweroff\n', mode: 0o755 },
  ];
}
