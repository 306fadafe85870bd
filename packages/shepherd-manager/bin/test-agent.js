#!/usr/bin/env node
// A stand-in for the BMaaS agent, for testing the shepherd against real
// machines and SSH servers: it reads a TakeoverInit from stdin and answers on
// stdout with a TakeoverResponse holding the init message it got and a fresh
// ed25519 public key, as the real agent does before it goes on to serve.
//
// Self-contained on purpose (node: built-ins only), so that it can be copied
// to a machine as a single file. The few protobuf fields are encoded by hand;
// the init message is echoed byte for byte, like the original test agent.

import { generateKeyPairSync } from 'node:crypto';

const LEN = 2; // protobuf wire type of strings, bytes and messages
const VARINT = 0;
const I64 = 1;
const I32 = 5;

try {
  const init = await readStdin();
  checkTakeoverInit(init);
  const response = field(1, field(1, init), field(2, ed25519PublicKey()));
  process.stdout.write(response);
} catch (error) {
  process.stderr.write(`test-agent: ${error instanceof Error ? error.message : error}\n`);
  process.exitCode = 1;
}

async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return Buffer.concat(chunks);
}

function ed25519PublicKey() {
  const { x } = generateKeyPairSync('ed25519').publicKey.export({ format: 'jwk' });
  return Buffer.from(x, 'base64url');
}

// Walks the wire format, insisting on a non-empty machine_id (field 1), string
// and bytes fields where TakeoverInit has them, and well-formed unknown fields.
function checkTakeoverInit(bytes) {
  let offset = 0;
  let machineId = '';
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
      if (number === 1) machineId = bytes.subarray(start, offset).toString('utf8');
    } else if (wireType === VARINT) varint();
    else if (wireType === I64) skip(8);
    else if (wireType === I32) skip(4);
    else throw new Error(`TakeoverInit: unsupported wire type ${wireType}`);
  }
  if (machineId === '') throw new Error('TakeoverInit on stdin has no machine_id');
}

function field(number, ...values) {
  const value = Buffer.concat(values);
  return Buffer.concat([encodeVarint(number * 8 + LEN), encodeVarint(value.length), value]);
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
