/**
 * What a work retriever may return, and what a selection hands to the work
 * it claims: machine IDs, or rows that carry one.
 */
export type WorkCandidate = string | { readonly machineId: string };
