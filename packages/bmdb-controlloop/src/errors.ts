/**
 * Every error the library throws on purpose is one of these classes, so callers
 * can branch with `instanceof` instead of matching messages. Each message names
 * the session, machine, process or value involved.
 */

/** Base class of all errors thrown by the BMDB library. */
export class BMDBError extends Error {
  override name = 'BMDBError';
}

/**
 * The session's deadline passed (its heartbeats stopped reaching the
 * database), or its row was collected. Every call on an expired session fails
 * with this error; start a new session to continue.
 */
export class SessionExpiredError extends BMDBError {
  override name = 'SessionExpiredError';
  constructor(
    readonly sessionId: string,
    detail?: string,
  ) {
    super(`BMDB session ${sessionId} expired${detail ? `: ${detail}` : ''}`);
  }
}

/** The session was closed by its owner; calls on it are refused. */
export class SessionClosedError extends BMDBError {
  override name = 'SessionClosedError';
  constructor(readonly sessionId: string) {
    super(`BMDB session ${sessionId} is closed`);
  }
}

/** The BMDB connection was closed; no new sessions or queries are possible. */
export class ConnectionClosedError extends BMDBError {
  override name = 'ConnectionClosedError';
  constructor(readonly componentName: string) {
    super(`BMDB connection of component ${JSON.stringify(componentName)} is closed`);
  }
}

/**
 * A work retriever found no candidate machines. The control-loop runner treats
 * this as "idle"; direct callers of `Session.work` should expect it.
 */
export class NothingToDoError extends BMDBError {
  override name = 'NothingToDoError';
  constructor(readonly process: string) {
    super(`no machine needs work for process ${process}`);
  }
}

/**
 * The machine is already claimed for this process by another live session.
 * Another candidate may well be free: retrying the claim is the right answer.
 */
export class WorkConflictError extends BMDBError {
  override name = 'WorkConflictError';
  constructor(
    readonly machineId: string,
    readonly process: string,
  ) {
    super(`machine ${machineId} is already claimed for process ${process} by another session`);
  }
}

/** How a piece of work ended. */
export type WorkOutcome = 'finished' | 'failed' | 'canceled';

/** Where ended work stands: its outcome, lost with its session, or ending right now. */
export type WorkEndState = WorkOutcome | 'lost' | 'ending';

/**
 * `finish` or `fail` was called on work that already ended or is ending.
 * (`cancel` after an end is a no-op, so `finally { work.cancel() }` is safe.)
 */
export class WorkEndedError extends BMDBError {
  override name = 'WorkEndedError';
  constructor(
    readonly machineId: string,
    readonly process: string,
    readonly state: WorkEndState,
  ) {
    const how =
      state === 'ending'
        ? 'is already being ended'
        : state === 'lost'
          ? 'was lost with its session'
          : `was already ${state}`;
    super(`work on machine ${machineId} for process ${process} ${how}`);
  }
}

/**
 * The work row is gone from the database: the session expired and the claim
 * was collected or taken over by another session. The work's effects were not
 * recorded.
 */
export class WorkLostError extends BMDBError {
  override name = 'WorkLostError';
  constructor(
    readonly machineId: string,
    readonly process: string,
    readonly sessionId: string,
  ) {
    super(
      `work on machine ${machineId} for process ${process} is no longer held by session ${sessionId} (session expired or claim taken over)`,
    );
  }
}

/** The database could not be reached (or refused the connection) when opening the BMDB. */
export class DatabaseUnreachableError extends BMDBError {
  override name = 'DatabaseUnreachableError';
  constructor(
    /** The URL with its password masked. */
    readonly url: string,
    reason: string,
    options?: ErrorOptions,
  ) {
    super(`could not connect to the BMDB at ${url}: ${reason}`, options);
  }
}

/** A textual setting (a duration or a rate limit) could not be parsed. */
export class InvalidSettingError extends BMDBError {
  override name = 'InvalidSettingError';
  constructor(
    readonly value: string,
    readonly expected: string,
  ) {
    super(`invalid value ${JSON.stringify(value)}: want ${expected}`);
  }
}

/** The embedded PostgreSQL server could not be initialised or started. */
export class EmbeddedDatabaseError extends BMDBError {
  override name = 'EmbeddedDatabaseError';
  constructor(
    message: string,
    readonly dataDir: string,
    options?: ErrorOptions,
  ) {
    super(`embedded PostgreSQL at ${dataDir}: ${message}`, options);
  }
}

/**
 * A selection was claimed for a process other than the one whose live work
 * and backoff it excludes: its claims would ignore that process's backoffs.
 */
export class ProcessMismatchError extends BMDBError {
  override name = 'ProcessMismatchError';
  constructor(
    /** The process the claim was for. */
    readonly process: string,
    /** The process the selection belongs to. */
    readonly selectionProcess: string,
  ) {
    super(
      `a selection for process ${selectionProcess} cannot claim work for process ${process}; build one for ${process} (selectionFor)`,
    );
  }
}
