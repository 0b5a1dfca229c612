-- dl2d reports: queries on the tables and views that the migrations create (dl2d/db/migrations/versions/).
--
--   sqlite3 -header -column /var/lib/dl2d/dl2d.sqlite < report.sql
--   PGTZ=UTC PGDATESTYLE=ISO psql 'postgresql://user@host/dl2d' -v start=NULL -v end=NULL -f report.sql
--
-- `dl2ctl report` runs the same queries (each block starts with a `-- name:` line, then its description).
-- Times are UTC; durations in seconds. JCT = finished_at - submitted_at of COMPLETED jobs.
--
-- Time window [:start, :end) (`dl2ctl report -S/--start, -E/--end`): each report counts the rows whose own
-- time is in it (jobs by finished_at, node samples by ts, job speed by the slot's started_at, events by ts,
-- decisions by created_at); a NULL bound is no bound. By hand: sqlite3 binds the parameters it is not given
-- as NULL (all rows); a window is `.param set :start "'2026-11-01'"` before `.read report.sql`. psql needs
-- them defined: NULL as above, or a window with -v start="'2026-11-01'" -v end="'2026-11-08 12:00'".
-- Days and hours are the first characters of the timestamp as text, which is UTC on SQLite and, on
-- PostgreSQL, in the session's time zone and DateStyle: hence PGTZ=UTC PGDATESTYLE=ISO (dl2ctl sets both).
-- The views v_jct_daily, v_gpu_util_hourly, ... (no window) give the same rows as these with no window.

-- name: jct_daily
-- Average job completion time per day of completion
SELECT v.day, COUNT(*) AS n_jobs, AVG(v.jct_s) AS avg_jct_s, MAX(v.jct_s) AS max_jct_s
FROM v_job_jct v JOIN jobs j ON j.id = v.job_id
WHERE (:start IS NULL OR j.finished_at >= :start) AND (:end IS NULL OR j.finished_at < :end)
GROUP BY v.day ORDER BY v.day;

-- name: jct_by_type
-- Average job completion time per job type
SELECT v.job_type, COUNT(*) AS n_jobs, AVG(v.jct_s) AS avg_jct_s, MAX(v.jct_s) AS max_jct_s
FROM v_job_jct v JOIN jobs j ON j.id = v.job_id
WHERE (:start IS NULL OR j.finished_at >= :start) AND (:end IS NULL OR j.finished_at < :end)
GROUP BY v.job_type ORDER BY v.job_type;

-- name: jct_by_owner
-- Average job completion time per owner
SELECT v.owner, COUNT(*) AS n_jobs, AVG(v.jct_s) AS avg_jct_s, MAX(v.jct_s) AS max_jct_s
FROM v_job_jct v JOIN jobs j ON j.id = v.job_id
WHERE (:start IS NULL OR j.finished_at >= :start) AND (:end IS NULL OR j.finished_at < :end)
GROUP BY v.owner ORDER BY v.owner;

-- name: gpu_util_hourly
-- GPU utilisation (%, weighted by GPUs and sample duration) and GPU memory in use, per hour
SELECT substr(CAST(ts AS TEXT), 1, 14) || '00' AS hour, COUNT(DISTINCT node) AS n_nodes,
       SUM(1.0 * gpu_util_mean_pct * gpu_count * n) / SUM(gpu_count * n) AS avg_gpu_util,
       SUM(1.0 * gpu_mem_used_bytes * n) / NULLIF(SUM(gpu_mem_total_bytes * n), 0) AS gpu_mem_frac
FROM node_samples
WHERE gpu_count > 0 AND gpu_util_mean_pct IS NOT NULL
  AND (:start IS NULL OR ts >= :start) AND (:end IS NULL OR ts < :end)
GROUP BY substr(CAST(ts AS TEXT), 1, 14) || '00' ORDER BY hour;

-- name: job_speed
-- Measured speed per job (epochs/h), the speed model's prediction for the sizes it ran with, their ratio
-- (speed factor: below 1 = slower than predicted, e.g. interference), GPU utilisation and memory from the
-- node agents, and slots in which a GPU of the job also ran another job
SELECT j.id AS job_id, j.name AS name, j.job_type AS job_type,
       COUNT(*) AS n_slots,
       AVG(s.epochs_per_s) * 3600.0 AS avg_epochs_per_h,
       AVG(s.predicted_epochs_per_s) * 3600.0 AS avg_predicted_epochs_per_h,
       AVG(s.speed_factor) AS avg_speed_factor,
       MIN(s.speed_factor) AS min_speed_factor,
       AVG(s.gpu_util_mean_pct) AS avg_gpu_util,
       MAX(s.gpu_mem_per_gpu_max_bytes) / 1073741824.0 AS max_gpu_mem_gib,
       SUM(CASE WHEN s.shared_gpu THEN 1 ELSE 0 END) AS n_shared_slots
FROM job_slot_stats s JOIN jobs j ON j.id = s.job_id JOIN slots sl ON sl.id = s.slot_id
WHERE (:start IS NULL OR sl.started_at >= :start) AND (:end IS NULL OR sl.started_at < :end)
GROUP BY j.id, j.name, j.job_type ORDER BY j.id;

-- name: resizes_per_job
-- Resizes, relaunches and hot scalings per job (jobs with at least one)
SELECT j.id AS job_id, j.name, j.owner, j.job_type,
       SUM(CASE WHEN e.kind = 'resize' THEN 1 ELSE 0 END) AS n_resize,
       SUM(CASE WHEN e.kind = 'relaunch' THEN 1 ELSE 0 END) AS n_relaunch,
       SUM(CASE WHEN e.kind = 'hot_scale' THEN 1 ELSE 0 END) AS n_hot_scale
FROM jobs j JOIN events e ON e.job_id = j.id
WHERE e.kind IN ('resize', 'relaunch', 'hot_scale')
  AND (:start IS NULL OR e.ts >= :start) AND (:end IS NULL OR e.ts < :end)
GROUP BY j.id, j.name, j.owner, j.job_type ORDER BY j.id;

-- name: resizes_daily
-- Resizes, relaunches and hot scalings per day
SELECT substr(CAST(ts AS TEXT), 1, 10) AS day,
       SUM(CASE WHEN kind = 'resize' THEN 1 ELSE 0 END) AS n_resize,
       SUM(CASE WHEN kind = 'relaunch' THEN 1 ELSE 0 END) AS n_relaunch,
       SUM(CASE WHEN kind = 'hot_scale' THEN 1 ELSE 0 END) AS n_hot_scale,
       COUNT(DISTINCT job_id) AS n_jobs
FROM events
WHERE kind IN ('resize', 'relaunch', 'hot_scale')
  AND (:start IS NULL OR ts >= :start) AND (:end IS NULL OR ts < :end)
GROUP BY substr(CAST(ts AS TEXT), 1, 10) ORDER BY day;

-- name: decision_sources
-- Scheduling decisions per policy in charge (the daemon's configured policy, by name: a reload that changes it
-- starts new rows) and per source: the policy itself, or the guardrails' fallback heuristic in its place
SELECT COALESCE(policy, '(not recorded)') AS policy, source, COUNT(*) AS n_decisions,
       1.0 * COUNT(*) / (SELECT COUNT(*) FROM decisions
                         WHERE (:start IS NULL OR created_at >= :start) AND (:end IS NULL OR created_at < :end))
           AS share,
       AVG(latency_ms) AS avg_latency_ms
FROM decisions
WHERE (:start IS NULL OR created_at >= :start) AND (:end IS NULL OR created_at < :end)
GROUP BY COALESCE(policy, '(not recorded)'), source ORDER BY policy, source;

-- name: decisions_daily
-- Policy vs fallback decisions per day
SELECT substr(CAST(created_at AS TEXT), 1, 10) AS day,
       SUM(CASE WHEN source = 'policy' THEN 1 ELSE 0 END) AS n_policy,
       SUM(CASE WHEN source = 'fallback' THEN 1 ELSE 0 END) AS n_fallback,
       AVG(latency_ms) AS avg_latency_ms
FROM decisions
WHERE (:start IS NULL OR created_at >= :start) AND (:end IS NULL OR created_at < :end)
GROUP BY substr(CAST(created_at AS TEXT), 1, 10) ORDER BY day;

-- name: fallback_reasons
-- Why the fallback heuristic was used
SELECT COALESCE(fallback_reason, '') AS fallback_reason, COUNT(*) AS n_decisions
FROM decisions
WHERE source = 'fallback'
  AND (:start IS NULL OR created_at >= :start) AND (:end IS NULL OR created_at < :end)
GROUP BY COALESCE(fallback_reason, '') ORDER BY n_decisions DESC, fallback_reason;
