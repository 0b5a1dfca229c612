-- dl2d reports: queries on the views that the migrations create (dl2d/db/migrations/versions/).
--
--   sqlite3 -header -column /var/lib/dl2d/dl2d.sqlite < report.sql
--   psql 'postgresql://user@host/dl2d' -f report.sql
--
-- `dl2ctl report` runs the same queries (each block starts with a `-- name:` line, then its description).
-- Times are UTC; durations in seconds. JCT = finished_at - submitted_at of COMPLETED jobs.

-- name: jct_daily
-- Average job completion time per day of completion
SELECT day, n_jobs, avg_jct_s, max_jct_s FROM v_jct_daily ORDER BY day;

-- name: jct_by_type
-- Average job completion time per job type
SELECT job_type, n_jobs, avg_jct_s, max_jct_s FROM v_jct_by_type ORDER BY job_type;

-- name: jct_by_owner
-- Average job completion time per owner
SELECT owner, n_jobs, avg_jct_s, max_jct_s FROM v_jct_by_owner ORDER BY owner;

-- name: gpu_util_hourly
-- GPU utilisation (%, weighted by GPUs and sample duration) and GPU memory in use, per hour
SELECT hour, n_nodes, avg_gpu_util, gpu_mem_frac FROM v_gpu_util_hourly ORDER BY hour;

-- name: job_speed
-- Measured speed per job (epochs/h), the speed model's prediction for the sizes it ran with, their ratio
-- (speed factor: below 1 = slower than predicted, e.g. interference), GPU utilisation and memory from the
-- node agents, and slots in which a GPU of the job also ran another job
SELECT job_id, name, job_type, n_slots, avg_epochs_per_h, avg_predicted_epochs_per_h, avg_speed_factor,
       min_speed_factor, avg_gpu_util, max_gpu_mem_gib, n_shared_slots
FROM v_job_speed ORDER BY job_id;

-- name: resizes_per_job
-- Resizes, relaunches and hot scalings per job (jobs with at least one)
SELECT job_id, name, owner, job_type, n_resize, n_relaunch, n_hot_scale
FROM v_resizes_per_job
WHERE n_resize + n_relaunch + n_hot_scale > 0
ORDER BY job_id;

-- name: resizes_daily
-- Resizes, relaunches and hot scalings per day
SELECT day, n_resize, n_relaunch, n_hot_scale, n_jobs FROM v_resizes_daily ORDER BY day;

-- name: decision_sources
-- Scheduling decisions taken by the policy network vs the fallback heuristic
SELECT source, n_decisions, share, avg_latency_ms FROM v_decision_sources ORDER BY source;

-- name: decisions_daily
-- Policy vs fallback decisions per day
SELECT day, n_policy, n_fallback, avg_latency_ms FROM v_decisions_daily ORDER BY day;

-- name: fallback_reasons
-- Why the fallback heuristic was used
SELECT fallback_reason, n_decisions FROM v_fallback_reasons ORDER BY n_decisions DESC, fallback_reason;
