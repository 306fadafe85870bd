import { describe, expect, test } from 'vitest';
import { redactUrl } from '../src/index.js';

describe('redactUrl', () => {
  test('masks the password of a URL, keeping the user', () => {
    expect(redactUrl('postgres://bmdb:s3cret@db.example:5432/bmdb')).toBe('postgres://bmdb:***@db.example:5432/bmdb');
    expect(redactUrl('postgres://bmdb:p@ss@db.example/bmdb')).toBe('postgres://bmdb:***@db.example/bmdb');
  });

  test("with 'userinfo', masks the user info whole: a user name alone may be a token", () => {
    expect(redactUrl('https://ops:topsecret@10.1.0.1/fleet.json', 'userinfo')).toBe('https://***@10.1.0.1/fleet.json');
    expect(redactUrl('https://t0ken@10.1.0.1/fleet.json', 'userinfo')).toBe('https://***@10.1.0.1/fleet.json');
  });

  test('masks text that does not parse as a URL too', () => {
    expect(redactUrl('postgres://bmdb:s3cret@[::1/bmdb')).toBe('postgres://bmdb:***@[::1/bmdb');
    expect(redactUrl('https://ops:topsecret@[::1/fleet.json', 'userinfo')).toBe('https://***@[::1/fleet.json');
  });

  test('leaves a URL with nothing to mask as it was', () => {
    expect(redactUrl('postgres://db.example/bmdb')).toBe('postgres://db.example/bmdb');
    expect(redactUrl('https://10.1.0.1/fleet.json', 'userinfo')).toBe('https://10.1.0.1/fleet.json');
  });
});
