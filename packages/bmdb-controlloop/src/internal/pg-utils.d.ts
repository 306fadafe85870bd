/** pg's own conversion of a query value to its text form (pg/lib/utils.js), untyped by `@types/pg`. */
declare module 'pg/lib/utils.js' {
  const utils: { prepareValue(value: unknown): string | Buffer | null };
  export default utils;
}
