/**
 * The BMDB control-loop core: a PostgreSQL machine database's connection,
 * sessions, exclusive work claims and their ends, backoff, history, tags
 * written with an end, and a runner for control loops over it. Nothing here
 * is about one product: the BMaaS machine model (its tags and every query
 * over them) is `@bmaas/bmdb-model`, built on this.
 *
 * @packageDocumentation
 */

export type { Backoff } from './backoff.js';
export { hasLiveWork, inBackoff, isHeld } from './conditions.js';
export { BMDB, type BMDBOptions, type ConnectionOptions, type IsolationLevel } from './connection.js';
export { type ControlLoop, type ControlLoopOptions, runControlLoop, type Task } from './control-loop.js';
export { parseDuration } from './duration.js';
export type { EmbeddedDatabaseOptions } from './embedded.js';
export {
  BMDBError,
  ConnectionClosedError,
  DatabaseUnreachableError,
  EmbeddedDatabaseError,
  InvalidSettingError,
  NothingToDoError,
  ProcessMismatchError,
  SessionClosedError,
  SessionExpiredError,
  WorkConflictError,
  WorkEndedError,
  type WorkEndState,
  WorkLostError,
  type WorkOutcome,
} from './errors.js';
export { parseLimiter, RateLimiter } from './limiter.js';
export type { ComponentSchema } from './migrations/index.js';
export { redactUrl } from './redact-url.js';
export { type RoundsOptions, runRounds } from './rounds.js';
export { type Database, WorkEvent } from './schema.js';
export {
  type ReadinessOptions,
  readyFor,
  type Selection,
  type SelectionRow,
  type SelectionSource,
  selectionFor,
} from './selection.js';
export { Session, type SessionOptions, type SessionState } from './session.js';
export type { FinishTags, TagName } from './tags.js';
export { Work, type WorkState } from './work.js';
export type { WorkCandidate } from './work-candidate.js';
