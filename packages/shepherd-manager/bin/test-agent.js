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
import { createPublicKey, generateKeyPairSync, randomBytes, sign } from 'node:crypto';
import { appendFileSync, readFileSync } from 'node:fs';
import { connect } from 'node:http2';
import { cpus, hostname, totalmem } from 'node:os';

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
  log(`heartbeating to ${endpoint} every ${interval} ms`);
  while (!stop.signal.aborted) {
    try {
      if (!session || session.closed || session.destroyed) {
        session = connect(`https://${endpoint}`, { ...(ca && { ca }), cert, key: privateKey });
        session.on('error', () => {});
      }
      const request = Buffer.concat([
        field(1, Buffer.from(machineId)),
        reportSent ? Buffer.alloc(0) : hardwareReport(),
      ]);
      await call(session, '/cloud.bmaas.server.api.AgentCallback/Heartbeat', request, stop.signal);
      if (!reportSent || failures > 0) log(`heartbeat accepted${reportSent ? '' : ' with a hardware report'}`);
      reportSent = true;
      failures = 0;
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
  session?.close();
  log('stopped');
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
// trailers, or in the headers of a trailers-only answer). Resolves on OK.
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
    stream.on('data', () => {});
    stream.on('error', reject);
    stream.on('close', () => {
      if (status === 0) resolve();
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
