CREATE TABLE IF NOT EXISTS owners (
  id TEXT PRIMARY KEY, pid INTEGER, started REAL, host TEXT, beat REAL, closed INTEGER DEFAULT 0);
CREATE TABLE IF NOT EXISTS jobs (
  key TEXT PRIMARY KEY, name TEXT, seed INTEGER, owner TEXT, spec BLOB, state TEXT, failure TEXT,
  detail TEXT, attempts INTEGER DEFAULT 0, usd REAL DEFAULT 0, out_dir TEXT, updated REAL);
CREATE TABLE IF NOT EXISTS attempts (
  job TEXT, attempt INTEGER, owner TEXT, machine TEXT, cloud TEXT, region TEXT, state TEXT, failure TEXT,
  detail TEXT, started REAL, ended REAL, usd REAL, PRIMARY KEY (job, attempt));
CREATE TABLE IF NOT EXISTS machines (
  name TEXT PRIMARY KEY, cloud TEXT, owner TEXT, job TEXT, seed INTEGER, attempt INTEGER, deadline REAL,
  state TEXT, phase TEXT, machine_id TEXT, region TEXT, hourly_usd REAL, created REAL, gone REAL,
  reason TEXT, detail TEXT, work TEXT, pid INTEGER, launched_at REAL, resumable INTEGER DEFAULT 0,
  machine TEXT, offer TEXT);
CREATE INDEX IF NOT EXISTS machines_state ON machines (state);
CREATE TABLE IF NOT EXISTS clouds (name TEXT, settings TEXT, PRIMARY KEY (name, settings));
CREATE TABLE IF NOT EXISTS events (
  id INTEGER PRIMARY KEY, t REAL, owner TEXT, job TEXT, seed INTEGER, attempt INTEGER, type TEXT, body TEXT);
