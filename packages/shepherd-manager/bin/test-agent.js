#!/usr/bin/env node
// A stand-in for the BMaaS agent, for testing the shepherd and the BMaaS
// server against real machines and SSH servers. Like the real agent:
//
// 1. It reads a TakeoverInit from stdin and answers on stdout with a
//    TakeoverResponse holding the init message it got and the public half of
//    a fresh ed25519 key. The init message is echoed byte for byte, like the
//    original test agent.
// 2. It then detaches (a child of its own, stdio closed, so the SSH command
//    returns) and heartbeats to the init's bmaas_endpoint: gRPC
//    cloud.bmaas.server.api.AgentCallback/Heartbeat over HTTP/2 and TLS,
//    presenting a self-signed client certificate over that key, trusting
//    ca_certificate when the init carries one (else the system's CAs). The
//    first heartbeats carry a hardware report, until one is accepted. It
//    heartbeats every SHEPHERD_TEST_AGENT_HEARTBEAT_INTERVAL (default 30s;
//    `500ms`, `2s`, `1m`), retries with backoff (0.5 s doubling up to the
//    interval) while the server is down or refuses it, and stops on
//    SIGTERM or SIGINT. `ps` shows it as `test-agent.js --heartbeat <machine ID>`.
//    SHEPHERD_TEST_AGENT_LOG names a file it appends one line per event to.
//    SHEPHERD_TEST_AGENT_SERVICE=cloud.agent.api calls the service under the
//    current upstream agent's name (default cloud.bmaas.server.api).
// 3. It installs what a heartbeat's answer asks for (the disk image request,
//    cloud/agent/api/disk_image.proto), while it keeps heartbeating: downloads
//    the image over HTTP(S) (verified against the system's CAs and the init's
//    ca_certificate), checks its sha256 while streaming, gunzips it if asked,
//    writes it from the root device's first byte (a block device, or in tests
//    a file of the disk's size: it never creates or grows one), and flushes
//    it. A sha256 mismatch, an HTTP error, a missing or too small device is
//    reported as an Error with the request's generation, after zeroing the
//    device's first MiB if anything was written (so it never boots an image
//    that failed its check); then it keeps heartbeating, to be asked again.
//    After Success is accepted it runs SHEPHERD_TEST_AGENT_REBOOT_COMMAND
//    (`sh -c`; in a VM `reboot -f`) and stops, as its machine reboots into
//    the installed OS (a report whose answer was lost is sent again until
//    answered). A report the answer says was ignored
//    (installation_report_outcome IGNORED: a newer request was made, or the
//    request canceled, while it finished) is not acted on: no reboot, and it
//    installs what the next answers ask for. An answer without the request
//    it is installing (the request canceled, or replaced by a newer
//    generation) stops that installation. With SHEPHERD_TEST_AGENT_USER_DATA_DIR set, the request's
//    cloud-init user-data is written there as <machine ID>.user-data.
//
// Endpoints under names reserved never to resolve (RFC 2606, 6761: .invalid,
// .example, .test, example.com/.net/.org) get no heartbeats and no detached
// process: the shepherd's tests that only exercise takeover use them, and
// must not leave processes behind.
//
// Self-contained on purpose (node: built-ins only), so that it can be copied
// to a machine as a single file: the few protobuf fields and the X.509
// certificate are encoded by hand.

import { spawn } from 'node:child_process';
import { createHash, createPublicKey, generateKeyPairSync, randomBytes, sign } from 'node:crypto';
import { appendFileSync, readFileSync } from 'node:fs';
import { open, realpath, stat, writeFile } from 'node:fs/promises';
import { get as httpGet } from 'node:http';
import { connect } from 'node:http2';
import { get as httpsGet } from 'node:https';
import { cpus, hostname, totalmem } from 'node:os';
import path from 'node:path';
import { Transform, Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { rootCertificates } from 'node:tls';
import { createGunzip } from 'node:zlib';

/** HeartbeatResponse.installation_report_outcome (100) telling a report was ignored (installation_report_outcome.proto). */
const REPORT_IGNORED = 2;

const LEN = 2; // protobuf wire type of strings, bytes and messages
const VARINT = 0;
const I64 = 1;
const I32 = 5;

try {
  if (process.argv[2] === '--heartbeat') await heartbeatForever(JSON.parse((await readStdin()).toString('utf8')));
  else await takeover();
} catch (error) {
  process.stderr.write(`test-agent: ${error instanceof Error ? error.message : error}\n`);
  process.exitCode = 1;
}

async function takeover() {
  const init = await readStdin();
  const fields = parseTakeoverInit(init);
  const { privateKey, publicKey } = generateKeyPairSync('ed25519');
  const response = field(1, field(1, init), field(2, Buffer.from(publicKey.export({ format: 'jwk' }).x, 'base64url')));
  await new Promise((resolve, reject) =>
    process.stdout.write(response, (error) => (error ? reject(error) : resolve())),
  );
  if (reservedName(endpointHost(fields.bmaasEndpoint))) return;
  // The heartbeater gets its settings, key included, on its stdin: never on a command line.
  const child = spawn(process.execPath, [process.argv[1], '--heartbeat', fields.machineId], {
    detached: true,
    stdio: ['pipe', 'ignore', 'ignore'],
  });
  const settings = {
    machineId: fields.machineId,
    endpoint: fields.bmaasEndpoint,
    caCertificate: fields.caCertificate.toString('base64'),
    privateKey: privateKey.export({ type: 'pkcs8', format: 'pem' }),
  };
  await new Promise((resolve, reject) => {
    child.once('error', reject);
    child.stdin.end(JSON.stringify(settings), resolve);
  });
  child.unref();
}

async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return Buffer.concat(chunks);
}

// Walks the wire format, insisting on a non-empty machine_id (field 1), string
// and bytes fields where TakeoverInit has them, and well-formed unknown fields.
function parseTakeoverInit(bytes) {
  let offset = 0;
  const fields = { machineId: '', bmaasEndpoint: '', caCertificate: Buffer.alloc(0) };
  const varint = () => {
    let value = 0;
    for (let shift = 0; shift < 64; shift += 7) {
      if (offset >= bytes.length) throw new Error('TakeoverInit: truncated varint');
      const byte = bytes[offset++];
      value += (byte & 0x7f) * 2 ** shift;
      if (byte < 0x80) return value;
    }
    throw new Error('TakeoverInit: varint too long');
  };
  const skip = (length) => {
    if (offset + length > bytes.length) throw new Error('TakeoverInit: truncated field');
    offset += length;
  };
  while (offset < bytes.length) {
    const key = varint();
    const number = Math.floor(key / 8);
    const wireType = key % 8;
    if (number === 0) throw new Error('TakeoverInit: field number 0');
    if (number <= 3 && wireType !== LEN) throw new Error(`TakeoverInit: field ${number} has wire type ${wireType}`);
    if (wireType === LEN) {
      const length = varint();
      const start = offset;
      skip(length);
      const value = bytes.subarray(start, offset);
      if (number === 1) fields.machineId = value.toString('utf8');
      if (number === 2) fields.bmaasEndpoint = value.toString('utf8');
      if (number === 3) fields.caCertificate = Buffer.from(value);
    } else if (wireType === VARINT) varint();
    else if (wireType === I64) skip(8);
    else if (wireType === I32) skip(4);
    else throw new Error(`TakeoverInit: unsupported wire type ${wireType}`);
  }
  if (fields.machineId === '') throw new Error('TakeoverInit on stdin has no machine_id');
  return fields;
}

function endpointHost(endpoint) {
  return endpoint.startsWith('[') ? endpoint.slice(1, endpoint.indexOf(']')) : endpoint.replace(/:\d+$/, '');
}

function reservedName(host) {
  const name = host.toLowerCase().replace(/\.$/, '');
  return /(^|\.)(invalid|example|test|example\.com|example\.net|example\.org)$/.test(name) || name === '';
}

// --- the heartbeater ---

async function heartbeatForever(settings) {
  const interval = parseInterval(process.env.SHEPHERD_TEST_AGENT_HEARTBEAT_INTERVAL ?? '30s');
  const { machineId, endpoint } = settings;
  const log = (line) => {
    const file = process.env.SHEPHERD_TEST_AGENT_LOG;
    if (file) appendFileSync(file, `${new Date().toISOString()} ${process.pid} ${machineId}: ${line}\n`);
  };
  const privateKey = settings.privateKey;
  const cert = certificatePem(selfSignedCertificate(privateKey, `agent ${machineId}`));
  const ca = settings.caCertificate ? certificatePem(Buffer.from(settings.caCertificate, 'base64')) : undefined;
  const stop = new AbortController();
  for (const signal of ['SIGTERM', 'SIGINT']) process.once(signal, () => stop.abort());

  let session;
  let reportSent = false;
  let failures = 0;
  const service = process.env.SHEPHERD_TEST_AGENT_SERVICE ?? 'cloud.bmaas.server.api';
  /** The installation under way: its generation, how to stop it, and its outcome once known. */
  let installation;
  /** Generations reported and accepted: their requests may still come back until the report is stored. */
  const reported = new Set();
  log(`heartbeating to ${endpoint} (${service}) every ${interval} ms`);
  while (!stop.signal.aborted) {
    try {
      if (!session || session.closed || session.destroyed) {
        session = connect(`https://${endpoint}`, { ...(ca && { ca }), cert, key: privateKey });
        session.on('error', () => {});
      }
      const report = installation?.report;
      const request = Buffer.concat([
        field(1, Buffer.from(machineId)),
        reportSent ? Buffer.alloc(0) : hardwareReport(),
        report ? field(3, installationReport(report)) : Buffer.alloc(0),
      ]);
      const answer = await call(session, `/${service}.AgentCallback/Heartbeat`, request, stop.signal);
      if (!reportSent || failures > 0) log(`heartbeat accepted${reportSent ? '' : ' with a hardware report'}`);
      reportSent = true;
      failures = 0;
      if (report && reportOutcome(answer) === REPORT_IGNORED) {
        // Of no request the machine waits on (a newer one was asked for meanwhile, or it was canceled):
        // not rebooting into that image, but installing what the answers ask for next.
        log(`installation report of generation ${report.generation} ignored: not acting on it`);
        installation = undefined;
      } else if (report) {
        log(`installation report of generation ${report.generation} accepted`);
        reported.add(report.generation);
        installation = undefined;
        if (report.error === undefined) {
          await reboot(log);
          break;
        }
      }
      const asked = installationRequest(answer);
      if (installation && installation.generation !== asked?.generation) {
        log(`installation of generation ${installation.generation} no longer asked for: stopping it`);
        installation.stop.abort();
        installation = undefined;
      }
      if (asked && !installation && !reported.has(asked.generation)) {
        installation = { generation: asked.generation, stop: new AbortController(), report: undefined };
        const current = installation;
        install(asked, { machineId, ca, signal: current.stop.signal, log }).then((outcome) => {
          if (!current.stop.signal.aborted) current.report = { generation: asked.generation, ...outcome };
        });
      }
      await sleep(interval, stop.signal);
    } catch (error) {
      if (stop.signal.aborted) break;
      failures++;
      session?.destroy();
      session = undefined;
      const delay = Math.min(interval, 500 * 2 ** Math.min(failures - 1, 16));
      log(`heartbeat failed (${error.message}); again in ${delay} ms`);
      await sleep(delay, stop.signal);
    }
  }
  installation?.stop.abort();
  session?.close();
  log('stopped');
}

/** Runs the configured reboot command, as the machine boots the installed OS next. */
async function reboot(log) {
  const command = process.env.SHEPHERD_TEST_AGENT_REBOOT_COMMAND;
  if (!command) {
    log('installed; no SHEPHERD_TEST_AGENT_REBOOT_COMMAND: stopping as if rebooted');
    return;
  }
  log(`installed; rebooting: ${command}`);
  const code = await new Promise((resolve) => {
    const child = spawn('sh', ['-c', command], { stdio: 'ignore' });
    child.on('error', () => resolve(-1));
    child.on('close', resolve);
  });
  log(`reboot command exited ${code}`);
}

// --- installing ---

/**
 * Installs a disk image request. Resolves with `{}` on success or `{ error }`
 * naming what failed; never rejects. Stops (resolving with an error nobody
 * reports) when `signal` aborts.
 */
async function install(request, { machineId, ca, signal, log }) {
  const { generation, diskImage } = request;
  if (!diskImage) {
    log(`installation generation ${generation}: ${request.type} requests are not supported`);
    return { error: `this agent installs disk images only; got a ${request.type} request` };
  }
  const { url, sha256, rootDevice, gzip, userData } = diskImage;
  log(`installing generation ${generation}: ${url} (${gzip ? 'gzip' : 'raw'}) onto ${rootDevice}`);
  const started = performance.now();
  let device;
  let written = 0;
  try {
    const capacity = await deviceSize(rootDevice);
    device = await open(rootDevice, 'r+');
    const response = await download(url, ca, signal);
    const hash = createHash('sha256');
    const tap = new Transform({
      transform(chunk, _encoding, done) {
        hash.update(chunk);
        done(null, chunk);
      },
    });
    const bounded = new Transform({
      transform(chunk, _encoding, done) {
        written += chunk.length;
        if (written > capacity)
          done(new Error(`device ${rootDevice} too small: ${capacity} bytes, the image is larger`));
        else done(null, chunk);
      },
    });
    let position = 0;
    const out = new Writable({
      highWaterMark: 1 << 20,
      write(chunk, _encoding, done) {
        device.write(chunk, 0, chunk.length, position).then(() => {
          position += chunk.length;
          done();
        }, done);
      },
    });
    const stages = [response, tap, ...(gzip ? [createGunzip()] : []), bounded, out];
    await pipeline(...stages, { signal });
    const got = hash.digest('hex');
    if (got !== sha256.toLowerCase()) throw new Error(`sha256 mismatch: downloaded ${got}, want ${sha256}`);
    await device.sync();
    const seconds = (performance.now() - started) / 1000;
    log(
      `installed generation ${generation}: ${written} bytes written and flushed in ${seconds.toFixed(3)} s (${(written / 1e6 / seconds).toFixed(1)} MB/s)`,
    );
    if (userData.length > 0 && process.env.SHEPHERD_TEST_AGENT_USER_DATA_DIR) {
      await writeFile(path.join(process.env.SHEPHERD_TEST_AGENT_USER_DATA_DIR, `${machineId}.user-data`), userData);
    }
    return {};
  } catch (error) {
    const message = signal.aborted ? 'stopped' : error.message;
    if (written > 0 && device) {
      // Never leave a device that could boot an image that failed: its first MiB goes.
      await device.write(Buffer.alloc(Math.min(written, 1 << 20)), 0, undefined, 0).catch(() => {});
      await device.sync().catch(() => {});
    }
    log(`installation of generation ${generation} failed: ${message}`);
    return { error: message };
  } finally {
    await device?.close().catch(() => {});
  }
}

/** The bytes a device can hold: a block device's from sysfs, a file's (as tests use) its size. */
async function deviceSize(device) {
  let info;
  try {
    info = await stat(device);
  } catch (error) {
    throw new Error(`root device ${device} missing (${error.code ?? error.message})`);
  }
  if (info.isFile()) return info.size;
  if (!info.isBlockDevice()) throw new Error(`root device ${device} is neither a block device nor a file`);
  const name = path.basename(await realpath(device));
  const sectors = Number(readFileSync(`/sys/class/block/${name}/size`, 'utf8').trim());
  return sectors * 512;
}

/** The response of a GET of `url` (status 200), TLS verified against the system's CAs and `ca`. */
function download(url, ca, signal) {
  return new Promise((resolve, reject) => {
    const parsed = new URL(url);
    const options = { signal, ...(parsed.protocol === 'https:' && ca && { ca: [...rootCertificates, ca] }) };
    const get = parsed.protocol === 'https:' ? httpsGet : parsed.protocol === 'http:' ? httpGet : undefined;
    if (!get) return reject(new Error(`image URL ${url}: not http or https`));
    const request = get(url, options, (response) => {
      if (response.statusCode !== 200) {
        response.resume();
        return reject(new Error(`HTTP status ${response.statusCode} for ${url}`));
      }
      resolve(response);
    });
    request.setTimeout(60_000, () => request.destroy(new Error(`no answer from ${url} within 60 s`)));
    request.on('error', (error) => reject(new Error(`download of ${url} failed: ${error.message}`)));
  });
}

// HeartbeatRequest.installation_report (3): OSInstallationReport { generation (1), success (2) | error (3) { error (1) } }.
function installationReport(report) {
  return Buffer.concat([
    varintField(1, report.generation),
    report.error === undefined ? field(2) : field(3, field(1, Buffer.from(report.error))),
  ]);
}

/**
 * HeartbeatResponse.installation_request (1), if any: OSInstallationRequest
 * { generation (1), metropolis (2) | disk_image (100) { url (1), sha256 (2),
 * root_device (3), compression (4: 1 is gzip), user_data (5) } }.
 */
function installationRequest(answer) {
  const request = parseMessage(answer).get(1)?.at(-1);
  if (!request) return undefined;
  const fields = parseMessage(request);
  const generation = fields.get(1)?.at(-1) ?? 0;
  const image = fields.get(100)?.at(-1);
  if (!image) return { generation, type: fields.has(2) ? 'metropolis' : 'unknown' };
  const d = parseMessage(image);
  const text = (n) => (d.get(n)?.at(-1) ?? Buffer.alloc(0)).toString('utf8');
  return {
    generation,
    type: 'disk image',
    diskImage: {
      url: text(1),
      sha256: text(2),
      rootDevice: text(3),
      gzip: d.get(4)?.at(-1) === 1,
      userData: d.get(5)?.at(-1) ?? Buffer.alloc(0),
    },
  };
}

/**
 * HeartbeatResponse.installation_report_outcome (100), this project's
 * extension: 1 accepted, 2 ignored; 0 when the server does not say (one that
 * predates it), taken as accepted, as upstream's agent does.
 */
function reportOutcome(answer) {
  return parseMessage(answer).get(100)?.at(-1) ?? 0;
}

/** A message's fields by number: varints as numbers, length-delimited ones as buffers. */
function parseMessage(bytes) {
  const fields = new Map();
  let offset = 0;
  const varint = () => {
    let value = 0;
    for (let shift = 0; shift < 64; shift += 7) {
      if (offset >= bytes.length) throw new Error('truncated varint in an answer');
      const byte = bytes[offset++];
      value += (byte & 0x7f) * 2 ** shift;
      if (byte < 0x80) return value;
    }
    throw new Error('varint too long in an answer');
  };
  while (offset < bytes.length) {
    const key = varint();
    const number = Math.floor(key / 8);
    const wireType = key % 8;
    let value;
    if (wireType === VARINT) value = varint();
    else if (wireType === LEN) {
      const length = varint();
      value = bytes.subarray(offset, offset + length);
      offset += length;
    } else if (wireType === I64) offset += 8;
    else if (wireType === I32) offset += 4;
    else throw new Error(`unsupported wire type ${wireType} in an answer`);
    if (value !== undefined) fields.set(number, [...(fields.get(number) ?? []), value]);
  }
  return fields;
}

function parseInterval(text) {
  const match = /^(\d+(?:\.\d+)?)(ms|s|m)$/.exec(text.trim());
  if (!match)
    throw new Error(`SHEPHERD_TEST_AGENT_HEARTBEAT_INTERVAL ${JSON.stringify(text)}: want e.g. 500ms, 2s, 1m`);
  return Number(match[1]) * { ms: 1, s: 1000, m: 60_000 }[match[2]];
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    const wake = () => {
      clearTimeout(timer);
      resolve();
    };
    signal.addEventListener('abort', wake, { once: true });
  });
}

// One unary gRPC call: a length-prefixed message out, grpc-status back (in the
// trailers, or in the headers of a trailers-only answer). Resolves on OK with
// the answer's message.
function call(session, path, message, signal) {
  return new Promise((resolve, reject) => {
    const stream = session.request(
      { ':method': 'POST', ':path': path, 'content-type': 'application/grpc+proto', te: 'trailers' },
      { signal },
    );
    stream.setTimeout(10_000, () => stream.close());
    let status;
    let statusMessage = '';
    const take = (headers) => {
      if (headers['grpc-status'] !== undefined) {
        status = Number(headers['grpc-status']);
        statusMessage = decodeURIComponent(String(headers['grpc-message'] ?? ''));
      }
    };
    stream.on('response', (headers) => {
      if (headers[':status'] !== 200) reject(new Error(`HTTP status ${headers[':status']}`));
      take(headers);
    });
    stream.on('trailers', take);
    const chunks = [];
    stream.on('data', (chunk) => chunks.push(chunk));
    stream.on('error', reject);
    stream.on('close', () => {
      const body = Buffer.concat(chunks);
      if (status === 0) resolve(body.length >= 5 ? body.subarray(5, 5 + body.readUInt32BE(1)) : Buffer.alloc(0));
      else if (status === undefined) reject(new Error('no gRPC status'));
      else reject(new Error(`gRPC status ${status}${statusMessage ? `: ${statusMessage}` : ''}`));
    });
    const prefix = Buffer.alloc(5);
    prefix.writeUInt32BE(message.length, 1);
    stream.end(Buffer.concat([prefix, message]));
  });
}

// HeartbeatRequest.hardware_report (2): AgentHardwareReport { report (1): Node }, from what
// this machine tells without privileges: DMI names where readable, memory, CPUs.
function hardwareReport() {
  const dmi = (name) => {
    try {
      return readFileSync(`/sys/class/dmi/id/${name}`, 'utf8').trim();
    } catch {
      return '';
    }
  };
  const text = (number, value) => (value ? field(number, Buffer.from(value)) : Buffer.alloc(0));
  const processors = cpus();
  const node = Buffer.concat([
    text(1, dmi('sys_vendor')),
    text(2, dmi('product_name') || hostname()),
    varintField(8, totalmem()),
    field(
      10,
      varintField(9, processors.length),
      text(10, processors[0]?.model.includes('AMD') ? 'AuthenticAMD' : 'GenuineIntel'),
      text(11, processors[0]?.model ?? ''),
    ),
  ]);
  return field(2, field(1, node), field(2, Buffer.from('reported by the shepherd test agent')));
}

function field(number, ...values) {
  const value = Buffer.concat(values);
  return Buffer.concat([encodeVarint(number * 8 + LEN), encodeVarint(value.length), value]);
}

function varintField(number, value) {
  return Buffer.concat([encodeVarint(number * 8 + VARINT), encodeVarint(value)]);
}

function encodeVarint(value) {
  const bytes = [];
  while (value >= 0x80) {
    bytes.push((value & 0x7f) | 0x80);
    value = Math.floor(value / 128);
  }
  bytes.push(value);
  return Buffer.from(bytes);
}

// --- a self-signed ed25519 X.509 certificate, DER (RFC 5280, RFC 8410) ---

function selfSignedCertificate(privateKeyPem, commonName) {
  const der = (tag, ...contents) => {
    const value = Buffer.concat(contents);
    const length =
      value.length < 0x80
        ? Buffer.from([value.length])
        : value.length < 0x100
          ? Buffer.from([0x81, value.length])
          : Buffer.from([0x82, value.length >> 8, value.length & 0xff]);
    return Buffer.concat([Buffer.from([tag]), length, value]);
  };
  const utcTime = (date) => der(0x17, Buffer.from(`${date.toISOString().replace(/[-:T]/g, '').slice(2, 14)}Z`));
  const ed25519 = der(0x30, der(0x06, Buffer.from([0x2b, 0x65, 0x70]))); // 1.3.101.112
  const name = der(
    0x30,
    der(0x31, der(0x30, der(0x06, Buffer.from([0x55, 0x04, 0x03])), der(0x0c, Buffer.from(commonName)))),
  );
  const serial = randomBytes(16);
  serial[0] = (serial[0] & 0x7f) | 0x01;
  const now = Date.now();
  const tbs = der(
    0x30,
    der(0xa0, der(0x02, Buffer.from([2]))),
    der(0x02, serial),
    ed25519,
    name,
    der(0x30, utcTime(new Date(now - 3_600_000)), utcTime(new Date(now + 365 * 86_400_000))),
    name,
    createPublicKey(privateKeyPem).export({ type: 'spki', format: 'der' }),
  );
  return der(0x30, tbs, ed25519, der(0x03, Buffer.from([0]), sign(null, tbs, privateKeyPem)));
}

function certificatePem(der) {
  return `-----BEGIN CERTIFICATE-----\n${der
    .toString('base64')
    .match(/.{1,64}/g)
    .join('\n')}\n-----END CERTIFICATE-----\n`;
}
