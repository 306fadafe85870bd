/** What each route of the fake Equinix API does to the fake project, and answers. */
import { randomUUID } from 'node:crypto';
import type { EquinixSshKey } from '../api/types.js';
import type { FakeStore } from './fake-store.js';
import { type Answer, type FakeRequest, type FakeRoute, NOT_FOUND, unprocessable } from './routes.js';

/** The one project the fake serves, and how it pages lists. */
export interface FakeProject {
  readonly store: FakeStore;
  readonly projectId: string;
  readonly basePath: string;
  readonly defaultPageSize: number;
}

export function answerRequest(project: FakeProject, route: FakeRoute, id: string, request: FakeRequest): Answer {
  const { store } = project;
  switch (route) {
    case 'GET /projects/{id}/devices': {
      if (id !== project.projectId) return NOT_FOUND;
      const { tag, hostname } = request.query;
      const devices = [...store.devices.values()].filter(
        (d) => (tag === undefined || d.tags.includes(tag)) && (hostname === undefined || d.hostname === hostname),
      );
      return page(project, request, 'devices', devices, (d) => store.read(d));
    }
    case 'GET /projects/{id}/hardware-reservations': {
      if (id !== project.projectId) return NOT_FOUND;
      const reservations = [...store.reservations.values()];
      return page(project, request, 'hardware_reservations', reservations, (r) => store.renderReservation(r));
    }
    case 'GET /devices/{id}': {
      const device = store.devices.get(id);
      return device ? { status: 200, body: store.read(device) } : NOT_FOUND;
    }
    case 'POST /projects/{id}/devices':
      return id === project.projectId ? createDevice(project.store, request.body) : NOT_FOUND;
    case 'POST /devices/{id}/actions': {
      const device = store.devices.get(id);
      if (!device) return NOT_FOUND;
      const type = (request.body as { type?: unknown } | undefined)?.type;
      if (!['reboot', 'power_on', 'power_off', 'reinstall'].includes(String(type))) {
        return unprocessable(`unknown action type ${JSON.stringify(type)}`);
      }
      device.actions.push(String(type));
      if (type === 'reboot') device.reboots++;
      // Powering takes no time here: the next read sees the device off (inactive) or on (active).
      if (type === 'power_off') device.state = 'inactive';
      if (type === 'power_on' && device.state === 'inactive') device.state = 'active';
      return { status: 202 };
    }
    case 'GET /projects/{id}/ssh-keys':
      if (id !== project.projectId) return NOT_FOUND;
      return page(project, request, 'ssh_keys', [...store.sshKeys.values()], (k) => k);
    case 'POST /projects/{id}/ssh-keys': {
      if (id !== project.projectId) return NOT_FOUND;
      const { label, key } = (request.body ?? {}) as { label?: unknown; key?: unknown };
      if (typeof label !== 'string' || label === '') return unprocessable('label is required');
      if (typeof key !== 'string' || key === '') return unprocessable('key is required');
      return { status: 201, body: addSshKey(store, { label, key }) };
    }
    case 'PUT /ssh-keys/{id}': {
      const existing = store.sshKeys.get(id);
      if (!existing) return NOT_FOUND;
      const { label, key } = (request.body ?? {}) as { label?: unknown; key?: unknown };
      const updated = {
        ...existing,
        label: typeof label === 'string' ? label : existing.label,
        key: typeof key === 'string' ? key : existing.key,
      };
      updated.fingerprint = fingerprint(updated.key);
      store.sshKeys.set(id, updated);
      return { status: 200, body: updated };
    }
  }
}

function createDevice(store: FakeStore, body: unknown): Answer {
  const request = (body ?? {}) as Record<string, unknown>;
  const { hostname, plan, operating_system: os, hardware_reservation_id: reservationId } = request;
  if (typeof hostname !== 'string' || hostname === '') return unprocessable('hostname is required');
  if (typeof plan !== 'string' || plan === '') return unprocessable('plan is required');
  if (typeof os !== 'string' || os === '') return unprocessable('operating_system is required');
  const keys = request.project_ssh_keys;
  if (keys !== undefined) {
    if (!Array.isArray(keys)) return unprocessable('project_ssh_keys must be a list');
    const unknown = keys.find((key) => !store.sshKeys.has(String(key)));
    if (unknown !== undefined) return unprocessable(`project SSH key ${String(unknown)} does not exist`);
  }
  const tags = Array.isArray(request.tags) ? request.tags.map(String) : [];
  if (reservationId !== undefined) {
    const reservation = store.reservations.get(String(reservationId));
    if (!reservation) return unprocessable(`hardware reservation ${String(reservationId)} was not found`);
    if (reservation.deviceId !== undefined || !reservation.provisionable) {
      return unprocessable(`Hardware reservation ${reservation.id} is already provisioned with a device`);
    }
    if (reservation.plan !== plan) {
      return unprocessable(`plan ${plan} does not match hardware reservation ${reservation.id} (${reservation.plan})`);
    }
  }
  const device = store.addDevice({
    hostname,
    plan,
    tags,
    state: 'provisioning',
    reservationId: reservationId === undefined ? undefined : String(reservationId),
  });
  return { status: 201, body: device };
}

function page<T>(
  project: FakeProject,
  request: FakeRequest,
  key: string,
  all: readonly T[],
  render: (item: T) => unknown,
): Answer {
  const perPage = clampInt(request.query.per_page, project.defaultPageSize, 1, 1000);
  const lastPage = Math.max(1, Math.ceil(all.length / perPage));
  const page = clampInt(request.query.page, 1, 1, Number.MAX_SAFE_INTEGER);
  const items = all.slice((page - 1) * perPage, page * perPage).map(render);
  const href = (p: number) => {
    const query = new URLSearchParams({ ...request.query, page: String(p), per_page: String(perPage) });
    return { href: `${project.basePath}${request.path}?${query}` };
  };
  return {
    status: 200,
    body: {
      [key]: items,
      meta: {
        first: href(1),
        previous: page > 1 ? href(page - 1) : null,
        self: href(page),
        next: page < lastPage ? href(page + 1) : null,
        last: href(lastPage),
        current_page: page,
        last_page: lastPage,
        total: all.length,
      },
    },
  };
}

/** Adds a project SSH key, as `POST /projects/{id}/ssh-keys` does. */
export function addSshKey(store: FakeStore, key: { label: string; key: string }): EquinixSshKey {
  const stored = { id: randomUUID(), label: key.label, key: key.key, fingerprint: fingerprint(key.key) };
  store.sshKeys.set(stored.id, stored);
  return stored;
}

function clampInt(text: string | undefined, fallback: number, min: number, max: number): number {
  const value = Number(text);
  if (text === undefined || !Number.isSafeInteger(value)) return fallback;
  return Math.min(max, Math.max(min, value));
}

function fingerprint(key: string): string {
  return key.trim().split(/\s+/)[1]?.slice(0, 16) ?? '';
}
