import { BMDBError } from './errors.js';

/** The tags a finish can write declaratively. */
export type TagName = 'agentStarted' | 'agentHeartbeat';

const TAG_NAMES: readonly TagName[] = ['agentStarted', 'agentHeartbeat'];

/**
 * Tag writes on the work's own machine, made in the statement that ends
 * the claim: `work.finish({ set: { agentStarted: { publicKey } } })`. Unlike
 * `finish(fn)`, they need no transaction of their own, so the library sends
 * the finishes of many workers together, as one statement.
 */
export interface FinishTags {
  /** Tags to set, replacing the machine's current ones. */
  readonly set?: {
    /** The agent started, with this public key, at `startedAt` (default the database's now). */
    readonly agentStarted?: { readonly publicKey: Uint8Array; readonly startedAt?: Date };
    /** An agent heartbeat at `at` (default, and at most, the database's now). */
    readonly agentHeartbeat?: { readonly at?: Date };
  };
  /** Tags to remove, where present. */
  readonly delete?: readonly TagName[];
}

/** One tag's write, as the end statement takes it. */
export interface TagWrite {
  readonly op: 'set' | 'delete';
  /** The time to record (`startedAt`, `at`); undefined for the database's now. */
  readonly at?: Date;
  /** AgentStarted's public key. */
  readonly publicKey?: Uint8Array;
}

/** The writes of a {@link FinishTags}, by tag. */
export type TagWrites = Partial<Record<TagName, TagWrite>>;

/**
 * Checks `tags` and turns them into one write per tag.
 *
 * @throws {@link BMDBError} for an unknown tag, a tag both set and deleted,
 *   a public key that is not bytes, or a time that is not a valid Date
 */
export function tagWrites(tags: FinishTags): TagWrites {
  const writes: Record<string, TagWrite> = {};
  const { agentStarted, agentHeartbeat } = tags.set ?? {};
  if (agentStarted !== undefined) {
    if (!(agentStarted.publicKey instanceof Uint8Array)) {
      throw new BMDBError('finish: set.agentStarted.publicKey must be a Uint8Array');
    }
    writes.agentStarted = {
      op: 'set',
      publicKey: agentStarted.publicKey,
      ...(agentStarted.startedAt !== undefined && {
        at: checkedDate(agentStarted.startedAt, 'agentStarted.startedAt'),
      }),
    };
  }
  if (agentHeartbeat !== undefined) {
    writes.agentHeartbeat = {
      op: 'set',
      ...(agentHeartbeat.at !== undefined && { at: checkedDate(agentHeartbeat.at, 'agentHeartbeat.at') }),
    };
  }
  for (const name of tags.delete ?? []) {
    if (!TAG_NAMES.includes(name)) {
      throw new BMDBError(`finish: cannot delete tag ${JSON.stringify(name)}; known tags: ${TAG_NAMES.join(', ')}`);
    }
    if (writes[name]?.op === 'set') throw new BMDBError(`finish: tag ${name} is both set and deleted`);
    writes[name] = { op: 'delete' };
  }
  return writes;
}

function checkedDate(value: Date, what: string): Date {
  if (!(value instanceof Date) || Number.isNaN(value.getTime())) {
    throw new BMDBError(`finish: set.${what} must be a valid Date`);
  }
  return value;
}
