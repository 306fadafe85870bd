const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/**
 * Whether `value` is a UUID in its usual form (8-4-4-4-12 hex digits, either
 * case): a machine ID the BMDB can hold, a `uuid` column's value. Check before
 * a value reaches a `uuid` comparison, which PostgreSQL refuses for anything
 * else.
 */
export function isUuid(value: string): boolean {
  return UUID.test(value);
}
