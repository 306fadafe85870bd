/** The bookkeeping columns of a claim statement's result row for one request. */
export interface ClaimStatus {
  /** The session was alive (its deadline not passed) when the claim ran. */
  readonly bmdb_live: boolean;
  /**
   * Candidates the statement saw but did not claim for anyone (taken by
   * concurrent claims, or left over); for a retriever's machine, whether it
   * exists (1) or not (0).
   */
  readonly bmdb_found: number;
  /** A candidate left unclaimed, to name in a conflict. */
  readonly bmdb_first_candidate: string | null;
  /** Whether a machine was claimed for this request; its selection row's columns follow. */
  readonly bmdb_claimed: boolean;
  /** The expired session a stale claim was taken over from. */
  readonly bmdb_took_over_from: string | null;
  /** The interval of the pair's last failure, if a backoff is recorded. */
  readonly bmdb_last_interval_seconds: number | null;
  readonly machine_id: string | null;
}

/** A batched claim's row: a {@link ClaimStatus} for the request at `bmdb_ord` (1-based). */
export interface BatchClaimStatus extends ClaimStatus {
  readonly bmdb_ord: string;
}
