/**
 * The enrollment of an agent its machine's BMC booted: a one-time token
 * issued for one boot of one machine, presented by the agent with its key.
 */
import { createHash, randomBytes } from 'node:crypto';
import { BMDBError } from '@bmaas/bmdb-controlloop';
import { hardwareTotals } from '@bmaas/bmdb-controlloop/extend';
import { isUuid, Secret } from '@bmaas/common';
import { type Kysely, sql } from 'kysely';
import { type EnrollmentRefusal, EnrollmentRefusedError } from '../errors.js';
import { type Database, OperatorAction } from '../schema.js';
import { setAgentStarted } from './agent-tags.js';
import { recordOperatorAction } from './operator-history.js';

/** A machine's enrollment token as issued; its plain text is nowhere else. */
export interface EnrollmentToken {
  readonly machineId: string;
  /** 32 random bytes, base64url. Never log it. */
  readonly token: Secret;
  /** The database's time after which the token is refused. */
  readonly expiresAt: Date;
}

/** What an agent presents to enroll (see {@link enrollAgent}). */
export interface EnrollmentRequest {
  readonly machineId: string;
  readonly token: string;
  /** The agent's public key (ed25519, raw), as AgentStarted holds it. */
  readonly agentPublicKey: Uint8Array;
  /** A serialized `cloud.bmaas.server.api.AgentHardwareReport`, stored as a heartbeat's would be. */
  readonly hardwareReport?: Uint8Array | undefined;
}

/** A machine's enrollment token, without it: when it was issued, until when it is good, when it was used. */
export interface AgentEnrollmentState {
  readonly issuedAt: Date;
  readonly expiresAt: Date;
  readonly enrolledAt: Date | undefined;
  /** The boot the token was issued for; undefined when it was issued without one. */
  readonly bootId: string | undefined;
}

/** Who enrolls, in the operator history: the agent itself, not a person. */
const ENROLL_ACTOR = 'bmaas-agent';

const TOKEN_BYTES = 32;

/**
 * Issues a one-time enrollment token for `machineId`, good for
 * `validForSeconds` by the database's clock, replacing any earlier one
 * (used or not): an agent booted with the earlier token is refused.
 * Only the token's sha256 is stored, with `bootId`, the boot it is for
 * (see {@link renewEnrollmentToken}, {@link revokeEnrollmentToken}).
 *
 * @throws {@link BMDBError} for a machine that does not exist, a validity under a second, or a boot ID that is no UUID
 */
export async function issueEnrollmentToken(
  db: Kysely<Database>,
  machineId: string,
  options: { validForSeconds: number; bootId?: string | undefined },
): Promise<EnrollmentToken> {
  const { validForSeconds, bootId } = options;
  checkValidity(machineId, validForSeconds);
  if (!isUuid(machineId)) throw new BMDBError(`enrollment token for machine ${machineId}: no such machine`);
  if (bootId !== undefined && !isUuid(bootId)) {
    throw new BMDBError(`enrollment token for machine ${machineId}: boot ID ${JSON.stringify(bootId)} is no UUID`);
  }
  const token = randomBytes(TOKEN_BYTES).toString('base64url');
  const row = await sql<{ expires_at: Date }>`
    INSERT INTO machine_agent_enrollment (machine_id, token_sha256, issued_at, expires_at, enrolled_at, boot_id)
    SELECT machine_id, ${sha256(token)}, now(), now() + make_interval(secs => ${validForSeconds}), NULL,
           ${bootId ?? null}::uuid
    FROM machines WHERE machine_id = ${machineId}
    ON CONFLICT (machine_id) DO UPDATE
    SET token_sha256 = excluded.token_sha256, issued_at = excluded.issued_at, expires_at = excluded.expires_at,
        enrolled_at = NULL, boot_id = excluded.boot_id
    RETURNING expires_at`.execute(db);
  const [issued] = row.rows;
  if (issued === undefined) throw new BMDBError(`enrollment token for machine ${machineId}: no such machine`);
  return { machineId, token: new Secret(token), expiresAt: issued.expires_at };
}

/**
 * Makes the unused token of boot `bootId` of `machineId` good for
 * `validForSeconds` from now, by the database's clock: for a boot whose
 * wait for the enrollment starts only once the BMC accepted it, however
 * long that took (a token that expired meanwhile is good again). Returns
 * the new expiry, or undefined when the machine's token is another boot's
 * or used: nothing changed then. Called before the wait, never after a
 * revocation.
 *
 * @throws {@link BMDBError} for a validity under a second
 */
export async function renewEnrollmentToken(
  db: Kysely<Database>,
  machineId: string,
  bootId: string,
  options: { validForSeconds: number },
): Promise<Date | undefined> {
  checkValidity(machineId, options.validForSeconds);
  if (!isUuid(machineId) || !isUuid(bootId)) return undefined;
  const { rows } = await sql<{ expires_at: Date }>`
    UPDATE machine_agent_enrollment SET expires_at = now() + make_interval(secs => ${options.validForSeconds})
    WHERE machine_id = ${machineId} AND boot_id = ${bootId} AND enrolled_at IS NULL
    RETURNING expires_at`.execute(db);
  return rows[0]?.expires_at;
}

/**
 * Revokes the unused token of boot `bootId` of `machineId`, at once: for a
 * boot that ended without its enrollment, so that nobody enrolls with it
 * once nobody waits for it. An agent presenting it is refused as for an
 * expired token. Returns whether a token was revoked (false: another boot's,
 * used, or already past).
 */
export async function revokeEnrollmentToken(db: Kysely<Database>, machineId: string, bootId: string): Promise<boolean> {
  if (!isUuid(machineId) || !isUuid(bootId)) return false;
  // now() can equal issued_at only within the issuing transaction; the CHECK (expires_at > issued_at) keeps
  // the microsecond after it then.
  const { rows } = await sql<{ machine_id: string }>`
    UPDATE machine_agent_enrollment SET expires_at = greatest(now(), issued_at + interval '1 microsecond')
    WHERE machine_id = ${machineId} AND boot_id = ${bootId} AND enrolled_at IS NULL AND expires_at > now()
    RETURNING machine_id`.execute(db);
  return rows.length > 0;
}

/** At least a second: a shorter one could round to no time at all in the database's microseconds. */
function checkValidity(machineId: string, validForSeconds: number): void {
  if (!Number.isFinite(validForSeconds) || validForSeconds < 1) {
    throw new BMDBError(
      `enrollment token for machine ${machineId}: validForSeconds must be at least 1 second, got ${validForSeconds}`,
    );
  }
}

/**
 * What {@link enrollAgent} did: `enrolled`, the token used now; `repeated`,
 * the same token presented again with the key it enrolled (the agent never
 * got the first answer), answered as the first was and nothing written.
 */
export type EnrollmentOutcome = 'enrolled' | 'repeated';

/**
 * How often a machine's refused enrollments are recorded: at most one
 * `Refused` entry in this many seconds since its last `EnrollAgent` entry,
 * so a client presenting tokens in a loop costs a read each, not a row each.
 */
export const ENROLLMENT_REFUSALS_RECORDED_EVERY_SECONDS = 60;

/**
 * Enrolls a BMC-booted agent: in one transaction, marks the machine's token
 * used, sets AgentStarted with the agent's key (as a takeover's finish
 * does), stores its hardware report (as a heartbeat does) and records an
 * `EnrollAgent` entry, `Succeeded`, in the operator history. The token is
 * compared by its sha256 in the database, and marked used by one UPDATE
 * that also checks it is unused and unexpired by the database's clock: of
 * two enrollments with one token, the second waits for the first's row lock
 * and then finds it used. (A constant-time comparison is not needed: what
 * is compared is a hash, which tells a guesser nothing about the token.)
 *
 * The token used already, presented again with the key it enrolled (the
 * machine's AgentStarted key), is answered as the first was (`repeated`),
 * expired or not, until a new token replaces it, and writes nothing: the
 * answer to the first was lost, and the agent asks again with the same
 * token and key. Any other key is refused (`Used`).
 *
 * A refusal is recorded too (`Refused`, its reason in `detail`, never the
 * token) when the machine exists, unless the machine's last `EnrollAgent`
 * entry is a refusal of the last {@link ENROLLMENT_REFUSALS_RECORDED_EVERY_SECONDS}
 * (the server's metrics count each); it is committed before the error is
 * thrown, so call this outside a transaction of your own, or that record
 * goes with it. A refusal takes no row lock: the UPDATE matches no row for a
 * wrong, used or expired token, so it waits for nobody; what follows only
 * reads, and writes at most that one entry.
 *
 * @throws {@link EnrollmentRefusedError} naming the machine and why
 * @throws {@link BMDBError} when the machine is installed (its OS runs, not an agent) and has no newer request
 */
export async function enrollAgent(db: Kysely<Database>, request: EnrollmentRequest): Promise<EnrollmentOutcome> {
  const { machineId } = request;
  if (!isUuid(machineId)) throw new EnrollmentRefusedError(machineId, 'NoToken');
  const outcome = db.isTransaction
    ? await enrollIn(db, request)
    : await db
        .transaction()
        .setIsolationLevel('read committed')
        .execute((trx) => enrollIn(trx, request));
  if (outcome === 'enrolled' || outcome === 'repeated') return outcome;
  throw new EnrollmentRefusedError(machineId, outcome);
}

/** The enrollment's statements in `trx`; returns what it did, or why it was refused. */
async function enrollIn(
  trx: Kysely<Database>,
  request: EnrollmentRequest,
): Promise<EnrollmentOutcome | EnrollmentRefusal> {
  const { machineId } = request;
  const tokenSha256 = sha256(request.token);
  // READ COMMITTED: a concurrent use of the same token holds the row; this
  // UPDATE waits for it, re-reads the row's new version and matches nothing.
  // A wrong, used or expired token matches no version of the row, so it locks nothing and waits for no one.
  const used = await sql<{ machine_id: string }>`
    UPDATE machine_agent_enrollment SET enrolled_at = now()
    WHERE machine_id = ${machineId} AND token_sha256 = ${tokenSha256}
      AND enrolled_at IS NULL AND expires_at > now()
    RETURNING machine_id`.execute(trx);
  if (used.rows.length === 0) {
    const refusal = await whyRefused(trx, machineId, tokenSha256, request.agentPublicKey);
    if (refusal.repeated) return 'repeated';
    if (refusal.machineExists) await recordRefusal(trx, machineId, refusal.reason);
    return refusal.reason;
  }
  await setAgentStarted(trx, machineId, { publicKey: request.agentPublicKey });
  // A new agent: the last one's heartbeat is not its own. Left in place, a machine booted again because its
  // agent went silent would stay silent, and eligible for another boot, until the new agent's first heartbeat.
  await trx.deleteFrom('machine_agent_heartbeat').where('machine_id', '=', machineId).execute();
  if (request.hardwareReport !== undefined) await storeHardwareReport(trx, machineId, request.hardwareReport);
  await recordOperatorAction(trx, {
    machineId,
    action: OperatorAction.EnrollAgent,
    outcome: 'Succeeded',
    actor: ENROLL_ACTOR,
    detail: { agentPublicKey: Buffer.from(request.agentPublicKey).toString('hex') },
  });
  return 'enrolled';
}

/**
 * Why the token did not enroll the machine: a token that is not the
 * machine's is `WrongToken` whatever the state of the machine's own, so a
 * guesser learns nothing of it. The machine's token, used, with the key
 * its enrollment recorded is `repeated`, no refusal.
 */
async function whyRefused(
  trx: Kysely<Database>,
  machineId: string,
  tokenSha256: Buffer,
  agentPublicKey: Uint8Array,
): Promise<{ reason: EnrollmentRefusal; machineExists: boolean; repeated: boolean }> {
  const { rows } = await sql<{ matches: boolean | null; used: boolean | null; same_key: boolean | null }>`
    SELECT e.token_sha256 = ${tokenSha256} AS matches, e.enrolled_at IS NOT NULL AS used,
      a.agent_public_key = ${Buffer.from(agentPublicKey)} AS same_key
    FROM machines m LEFT JOIN machine_agent_enrollment e ON e.machine_id = m.machine_id
      LEFT JOIN machine_agent_started a ON a.machine_id = m.machine_id
    WHERE m.machine_id = ${machineId}`.execute(trx);
  const [row] = rows;
  if (row === undefined) return { reason: 'NoToken', machineExists: false, repeated: false };
  // Matching, unused and yet not enrolled: expired (the UPDATE checked it by the same clock).
  const reason: EnrollmentRefusal =
    row.matches === null ? 'NoToken' : !row.matches ? 'WrongToken' : row.used ? 'Used' : 'Expired';
  return { reason, machineExists: true, repeated: reason === 'Used' && row.same_key === true };
}

/**
 * Records the refusal, unless the machine's last `EnrollAgent` entry within
 * {@link ENROLLMENT_REFUSALS_RECORDED_EVERY_SECONDS} is a refusal: a range
 * of `operator_history_machine_idx` (the machine's last interval), no row
 * lock. Concurrent refusals of one machine take turns at a transaction's
 * advisory lock of the machine, tried, never waited for: a refusal that
 * finds it taken leaves the record to its holder; one that gets it reads
 * after the last holder's commit, so it sees that holder's entry. The two-key
 * advisory locks are a space apart from the one-key ones others take.
 */
async function recordRefusal(trx: Kysely<Database>, machineId: string, reason: EnrollmentRefusal): Promise<void> {
  const { rows } = await sql<{ turn: boolean }>`
    SELECT pg_try_advisory_xact_lock(hashtext('bmdb enrollment refusal'), hashtext(${machineId})) AS turn`.execute(trx);
  if (rows[0]?.turn !== true) return;
  const cause = new EnrollmentRefusedError(machineId, reason).message;
  await sql`
    INSERT INTO operator_history (machine_id, action, outcome, actor, cause, detail)
    SELECT ${machineId}::uuid, ${OperatorAction.EnrollAgent}, 'Refused', ${ENROLL_ACTOR}, ${cause},
      ${JSON.stringify({ reason })}::jsonb
    WHERE NOT EXISTS (
      SELECT 1 FROM (
        SELECT outcome FROM operator_history
        WHERE machine_id = ${machineId} AND action = ${OperatorAction.EnrollAgent}
          AND "timestamp" > now() - make_interval(secs => ${ENROLLMENT_REFUSALS_RECORDED_EVERY_SECONDS})
        ORDER BY "timestamp" DESC LIMIT 1) AS last
      WHERE last.outcome = 'Refused')`.execute(trx);
}

/** The hardware report as the heartbeat statement stores it, with its totals for the fleet's gauges. */
async function storeHardwareReport(trx: Kysely<Database>, machineId: string, report: Uint8Array): Promise<void> {
  const totals = hardwareTotals(report);
  await sql`
    INSERT INTO machine_hardware_report
      (machine_id, hardware_report_raw, hardware_reported_at, cpu_threads, memory_bytes, disks, disk_bytes)
    VALUES (${machineId}, ${Buffer.from(report)}, now(), ${totals?.cpuThreads ?? null}, ${totals?.memoryBytes ?? null},
            ${totals?.disks ?? null}, ${totals?.diskBytes ?? null})
    ON CONFLICT (machine_id) DO UPDATE
    SET hardware_report_raw = excluded.hardware_report_raw, hardware_reported_at = excluded.hardware_reported_at,
        cpu_threads = excluded.cpu_threads, memory_bytes = excluded.memory_bytes, disks = excluded.disks,
        disk_bytes = excluded.disk_bytes`.execute(trx);
}

/** The machine's enrollment token's state (never the token), if one was issued: for a loop waiting for its agent. */
export async function agentEnrollment(
  db: Kysely<Database>,
  machineId: string,
): Promise<AgentEnrollmentState | undefined> {
  if (!isUuid(machineId)) return undefined;
  const row = await db
    .selectFrom('machine_agent_enrollment')
    .select(['issued_at', 'expires_at', 'enrolled_at', 'boot_id'])
    .where('machine_id', '=', machineId)
    .executeTakeFirst();
  return (
    row && {
      issuedAt: row.issued_at,
      expiresAt: row.expires_at,
      enrolledAt: row.enrolled_at ?? undefined,
      bootId: row.boot_id ?? undefined,
    }
  );
}

function sha256(token: string): Buffer {
  return createHash('sha256').update(token).digest();
}
