/**
 * The part of an authorized_keys line that identifies the key (type and
 * base64 blob), without options or comment; `undefined` if it is not one.
 */
export function keyMaterial(line: string): string | undefined {
  const fields = line.trim().split(/\s+/);
  // Skip leading options ("no-pty,command=... ssh-ed25519 AAAA... comment").
  const at = fields.findIndex((field) => /^(ssh-|ecdsa-|sk-)/.test(field));
  const type = fields[at];
  const blob = fields[at + 1];
  if (at < 0 || type === undefined || blob === undefined || !/^[A-Za-z0-9+/]+={0,3}$/.test(blob)) return undefined;
  return `${type} ${blob}`;
}

/** Whether two authorized_keys lines hold the same key, whatever their comments. */
export function sameKey(a: string, b: string): boolean {
  const material = keyMaterial(a);
  return material !== undefined && material === keyMaterial(b);
}
