/**
 * What a package built on the core needs beyond the main entry: the parts
 * of a BMDB connection (its prepared statements, metrics and connection
 * settings), the batching of many callers' statements into one, and the
 * retry of a statement on the errors after which nothing ran. The machine
 * model, `@bmaas/bmdb-model`, is such a package: its agent heartbeats and
 * fleet gauges run on these.
 *
 * A control loop of one's own needs none of it: the main entry has what it
 * calls. This entry follows the core's version like the main one, but what
 * it exports is the core's inside, shaped by what the model needs; read its
 * modules before building on it.
 *
 * @packageDocumentation
 */

export { type BMDBExtension, extensionOf } from './connection.js';
export { type HardwareTotals, hardwareTotals } from './hardware-totals.js';
export { type Batch, Batcher, type BatcherOptions } from './internal/batcher.js';
export { isConnectionLost } from './internal/connection-lost.js';
export type { PreparedStatements } from './internal/prepared.js';
export { withRetry } from './internal/retry.js';
export { retryMetrics } from './internal/retry-metrics.js';
export type { BMDBMetrics } from './metrics.js';
export type { Database, Timestamp } from './schema.js';
