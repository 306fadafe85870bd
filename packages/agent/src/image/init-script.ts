// The agent environment's boot, as busybox shell scripts: /init and udhcpc's lease script.

/** Where what the boot path hands over lands (an appended initramfs, the ISO's config.cpio). */
export const CONFIG_DIR = '/etc/bmaas';
/** The agent's log in the environment (also on the console). */
export const AGENT_LOG = '/var/log/bmaas-agent.log';
/** The bundled agent in the environment. */
export const AGENT_PATH = '/opt/bmaas/agent.cjs';
export const UDHCPC_SCRIPT = `${CONFIG_DIR}/udhcpc.script`;
/** Asks DHCP on NICs as they gain link ({@link dhcpOnLinkScript}). */
export const DHCP_ON_LINK = `${CONFIG_DIR}/dhcp-on-link`;
/**
 * How long NICs without link are watched for one after the first 10 s: a
 * switch port's spanning tree takes 30-50 s, a cable may be plugged in later.
 */
export const LINK_WATCH_SECONDS = 600;
/**
 * What a BMC boot hands the agent instead of a takeover's handover.json: the
 * init and its machine's one-time enrollment token (`bmaas-agent enroll`).
 */
export const ENROLLMENT_JSON = `${CONFIG_DIR}/enrollment.json`;
/** The running OS's network the takeover captured (a NetworkConfig as JSON), brought up again by MAC. */
export const NETWORK_JSON = `${CONFIG_DIR}/network.json`;

/**
 * The environment's /init: mounts, the drivers its devices ask for, network (handed over, else DHCP
 * on every NIC as it gains link, {@link dhcpOnLinkScript}), then the agent (`run` with a takeover's
 * handover.json; `enroll` with a BMC boot's enrollment.json and no
 * handover.json), restarted if it ends without a reboot. Everything it prints goes to the console (the last `console=` of
 * the command line, the serial port on the ISO) and to {@link AGENT_LOG}.
 */
export const INIT_SCRIPT = `#!/bin/sh
# The BMaaS agent environment (busybox). Nothing machine-specific is in this image:
# ${CONFIG_DIR}/handover.json (or, booted by the BMC, enrollment.json), agent-flags and network
# come from an initramfs appended by the takeover or the boot medium; bmaas.interface/address/gateway/dns on the kernel
# command line override the network.
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mkdir -p /var/log
exec >/dev/console 2>&1 </dev/null
say() { echo "bmaas-init: $*" | tee -a ${AGENT_LOG}; }
# The boot ID shows a takeover's kexec: a new boot, not the OS it replaced.
say "agent environment starting on $(uname -r), boot ID $(cat /proc/sys/kernel/random/boot_id)"

# Drivers by the hardware present: each device's modalias (a PCI device's IDs and class, a virtio
# device's, a SCSI device's type) resolved through the image's modules.alias by modprobe, then again
# for the devices those drivers added (a controller's disks, virtio's devices), until no device asks
# for one not asked for before. What the kernel requests itself (efivarfs, a bond, crc32c) reaches
# /sbin/modprobe through the kernel.
asked=" "
while true; do
  aliases=$(cat /sys/bus/*/devices/*/modalias 2>/dev/null | sort -u)
  new=""
  set -f
  for alias in $aliases; do
    case "$asked" in *" $alias "*) ;; *) new="$new $alias" ;; esac
  done
  [ -n "$new" ] || { set +f; break; }
  asked="$asked$new "
  modprobe -q -a $new
  set +f
done
say "drivers loaded: $(cut -d' ' -f1 /proc/modules | sort | tr '\\n' ' ')"
if [ -d /sys/firmware/efi ]; then
  mount -t efivarfs efivarfs /sys/firmware/efi/efivars || say "efivarfs not mounted: no boot entry can be added"
fi

BMAAS_INTERFACE= BMAAS_ADDRESS= BMAAS_GATEWAY= BMAAS_DNS=
[ -f ${CONFIG_DIR}/network ] && . ${CONFIG_DIR}/network
for word in $(cat /proc/cmdline); do
  case "$word" in
    bmaas.interface=*) BMAAS_INTERFACE="\${word#*=}" ;;
    bmaas.address=*) BMAAS_ADDRESS="\${word#*=}" ;;
    bmaas.gateway=*) BMAAS_GATEWAY="\${word#*=}" ;;
    bmaas.dns=*) BMAAS_DNS="$(echo "\${word#*=}" | tr , ' ')" ;;
  esac
done

ip link set lo up
nics=""
for path in /sys/class/net/*; do
  [ -e "$path/device" ] && nics="$nics \${path##*/}"
done
for nic in $nics; do ip link set "$nic" up; done
handed=""
if [ -n "$BMAAS_ADDRESS" ]; then
  # The NIC by name or by MAC; none given (or none matching), the first.
  nic=""
  for candidate in $nics; do
    [ "$candidate" = "$BMAAS_INTERFACE" ] && nic="$candidate"
    [ "$(cat /sys/class/net/$candidate/address)" = "$BMAAS_INTERFACE" ] && nic="$candidate"
  done
  [ -n "$nic" ] || nic=$(echo $nics | cut -d' ' -f1)
  ip addr add "$BMAAS_ADDRESS" dev "$nic" && say "$nic: $BMAAS_ADDRESS (handed over)"
  [ -n "$BMAAS_GATEWAY" ] && ip route add default via "$BMAAS_GATEWAY" dev "$nic"
  for server in $BMAAS_DNS; do echo "nameserver $server"; done >/etc/resolv.conf
  handed=yes
elif [ -f ${NETWORK_JSON} ]; then
  # The network the takeover captured on the OS it replaced, set up again by MAC (bonds, VLANs,
  # addresses, routes), and DHCP where that OS had a lease.
  say "bringing up the network the takeover captured"
  mkdir -p /run/bmaas
  node ${AGENT_PATH} network-up ${NETWORK_JSON} >/run/bmaas/dhcp 2>/run/bmaas/network-up.log || say "network-up failed"
  tee -a ${AGENT_LOG} </run/bmaas/network-up.log
  [ -s /run/bmaas/dhcp ] && ${DHCP_ON_LINK} $(cat /run/bmaas/dhcp)
  # Neither a default route nor a lease: the capture held nothing that reaches the server.
  if [ -n "$(ip route show default)" ] || [ -s /run/bmaas/dhcp ]; then handed=yes; else say "the captured network has no default route: DHCP instead"; fi
fi
[ -n "$handed" ] || ${DHCP_ON_LINK} $nics
ip -4 addr show | grep inet | tee -a ${AGENT_LOG}

if [ ! -f ${CONFIG_DIR}/handover.json ] && [ ! -f ${ENROLLMENT_JSON} ]; then
  say "neither ${CONFIG_DIR}/handover.json nor ${ENROLLMENT_JSON} handed over: the agent cannot start"
  while true; do sleep 3600; done
fi
set --
[ -f ${CONFIG_DIR}/agent-flags ] && while IFS= read -r flag; do [ -n "$flag" ] && set -- "$@" "$flag"; done <${CONFIG_DIR}/agent-flags
while true; do
  if [ -f ${CONFIG_DIR}/handover.json ]; then
    say "starting the agent"
    node ${AGENT_PATH} run --reboot-command "reboot -f" --send-log ${AGENT_LOG} "$@" <${CONFIG_DIR}/handover.json 2>&1 | tee -a ${AGENT_LOG}
  else
    # Booted by the BMC: no takeover handed a key over. The agent makes one, enrolls it with the
    # one-time token, and writes handover.json, so that a restart runs it rather than enrolling again.
    say "enrolling the agent"
    node ${AGENT_PATH} enroll --enrollment ${ENROLLMENT_JSON} --write-handover ${CONFIG_DIR}/handover.json --reboot-command "reboot -f" --send-log ${AGENT_LOG} "$@" 2>&1 | tee -a ${AGENT_LOG}
    if [ ! -f ${CONFIG_DIR}/handover.json ]; then
      # Refused (the token is wrong, expired or used; the machine installed): asking again would be
      # refused again. The agent ran the reboot command already; should that have returned, reboot
      # here. This boot was a one-time override whose media the booter ejects: the disk boots (an
      # installed machine its OS), and a machine that needs the agent is booted with a new token.
      say "the enrollment was refused: rebooting into the machine's disk"
      reboot -f
      while true; do sleep 3600; done
    fi
  fi
  say "the agent ended; starting it again in 10 s"
  sleep 10
done
`;

/**
 * `/etc/bmaas/dhcp-on-link`: asks DHCP on each NIC named (`dhcp-on-link eth0 eth1`)
 * once it has link. Those with link within the first 10 s (carrier takes a
 * moment after the link is set up) are asked in the foreground, so that the
 * agent starts with a lease; the rest are watched in the background for
 * `linkWatchSeconds` and asked as each gains link. udhcpc keeps asking and
 * renewing its lease while the environment runs (no -q): five tries in the
 * foreground, then on in the background (-b).
 *
 * @param root - the directory sysfs and the log are under: empty (`/`) in the image, a scratch tree in tests
 */
export function dhcpOnLinkScript(root = '', linkWatchSeconds = LINK_WATCH_SECONDS): string {
  return `#!/bin/sh
say() { echo "bmaas-init: $*" | tee -a ${root}${AGENT_LOG}; }
dhcp() { udhcpc -i "$1" -s ${UDHCPC_SCRIPT} -t 5 -T 2 -b >/dev/null 2>&1 || say "$1: no DHCP lease"; }
linked() { [ "$(cat ${root}/sys/class/net/$1/carrier 2>/dev/null)" = 1 ]; }
tries=0
while [ $tries -lt 20 ]; do
  for nic in "$@"; do linked "$nic" && break 2; done
  tries=$((tries + 1)); sleep 0.5
done
unlinked=""
for nic in "$@"; do
  if linked "$nic"; then dhcp "$nic"; else unlinked="$unlinked $nic"; fi
done
[ -n "$unlinked" ] || exit 0
say "no link yet on$unlinked: watching for ${linkWatchSeconds} s, DHCP on each that gains it"
(
  seconds=0
  while [ -n "$unlinked" ] && [ $seconds -lt ${linkWatchSeconds} ]; do
    sleep 1
    seconds=$((seconds + 1))
    still=""
    for nic in $unlinked; do
      if linked "$nic"; then
        say "$nic: link up: asking DHCP"
        dhcp "$nic" &
      else
        still="$still $nic"
      fi
    done
    unlinked=$still
  done
  [ -z "$unlinked" ] || say "no link on$unlinked after ${linkWatchSeconds} s: no longer watched"
) &
exit 0
`;
}

/**
 * udhcpc's lease script: the lease's address on the NIC, its default route
 * and resolv.conf. What a lease added is kept in /run/bmaas/lease.<NIC>, so
 * that a lease lost (deconfig) or changed takes away only its own address
 * and route: addresses set beside it (a captured network's) stay.
 *
 * @param root - the directory /run, /etc, the log and the console are under: empty (`/`) in the image, a scratch tree in tests
 */
export function leaseScript(root = ''): string {
  return `#!/bin/sh
lease=${root}/run/bmaas/lease.$interface
# What the last lease added: "address/prefix gateway".
added="" gateway=""
[ -f "$lease" ] && read -r added gateway <"$lease"
drop() {
  [ -n "$gateway" ] && ip route del default via "$gateway" dev "$interface"
  [ -n "$added" ] && ip addr del "$added" dev "$interface"
  rm -f "$lease"
}
case "$1" in
  deconfig) drop; ip link set "$interface" up ;;
  bound|renew)
    # A renewal of the same lease changes nothing: connections over it stay up.
    if [ "$added" != "$ip/\${mask:-24}" ]; then
      drop
      mkdir -p ${root}/run/bmaas
      ip addr add "$ip/\${mask:-24}" dev "$interface"
      gateway=""
      for candidate in $router; do
        ip route add default via "$candidate" dev "$interface" && gateway=$candidate && break
      done
      echo "$ip/\${mask:-24} $gateway" >"$lease"
      # udhcpc's own output is discarded; this line goes to the console and the log.
      echo "bmaas-init: $interface: $ip/\${mask:-24} (DHCP)" | tee -a ${root}${AGENT_LOG} >${root}/dev/console
    fi
    [ -n "$dns" ] && for server in $dns; do echo "nameserver $server"; done >${root}/etc/resolv.conf
    ;;
esac
exit 0
`;
}

/** udhcpc's lease script in the image. */
export const UDHCPC_SCRIPT_TEXT = leaseScript();
/** `/etc/bmaas/dhcp-on-link` in the image. */
export const DHCP_ON_LINK_TEXT = dhcpOnLinkScript();
