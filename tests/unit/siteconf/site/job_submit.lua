-- The site's own job_submit.lua: every job needs a time limit.
function slurm_job_submit(job_desc, part_list, submit_uid)
  if job_desc.time_limit == nil or job_desc.time_limit == 4294967294 then
    slurm.log_user("site rule: give your job a time limit (--time)")
    return slurm.ERROR
  end
  job_desc.comment = "site-rule-checked"
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end

return slurm.SUCCESS
