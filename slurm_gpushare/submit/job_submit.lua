-- The job_submit.lua program: the submission rules of slurm_gpushare/submit/
-- (parse.py and decide.py are its Python twin; tests/cases/submit.yaml runs
-- through both and requires the same decisions, codes, messages and rewrites).
--
-- This file alone is no job_submit.lua: `gpushare render` writes a generated
-- prelude (templates/job_submit.prelude.lua.j2) that defines the locals P (the
-- policy tables), M (the messages) and C (the violation codes), then this
-- file, unchanged.
--
-- Written for Lua 5.1 (Debian links job_submit_lua.so to liblua5.1) and 5.4:
-- no goto, no //, no table.unpack, no bit operators, no float exponents.
--
-- A Lua error, or a return value that is not a number, lets a job through
-- (job_submit_lua.c), so each entry point runs under pcall and an internal
-- error rejects the job (fail closed) unless the policy says fail_open.
-- slurm.log_user/log_info take a format string: messages always go as "%s".

local FAIL_OPEN = P.fail_open == true

-- Lua 5.4's generational collector frees a call's short-lived tables in small
-- young collections instead of incremental steps over the whole heap: on 5.4
-- the p99 per call drops from ~50 us to ~17 us (bench/submit.py). This state
-- is the plugin's own. Lua 5.1 has no such mode (the pcall makes it a no-op).
if _VERSION >= "Lua 5.4" then
  pcall(collectgarbage, "generational")
end
-- Shared, never written: what a decision without violations or rewritten
-- fields holds, and the values of a message that takes none. Fewer tables
-- per call is less garbage, and garbage collection is where the tail of the
-- call time comes from (bench/submit.py).
local NONE = {}
local EMPTY = {}
-- tier name -> { tier }: the tier list of a job that names one partition, built here once.
local ONLY = {}
for _, tier in ipairs(P.tiers) do
  ONLY[tier.name] = { tier }
end

local function fmt(n)
  return string.format("%d", n)
end

-- split("a,,b", ",") -> {"a", "", "b"}: empty parts are kept (and refused later).
local function split(s, sep)
  local out, start = {}, 1
  while true do
    local i = string.find(s, sep, start, true)
    if not i then
      out[#out + 1] = string.sub(s, start)
      return out
    end
    out[#out + 1] = string.sub(s, start, i - 1)
    start = i + 1
  end
end

local function msg(name, v)
  return M[name](v)
end

local function violation(rule, v)
  return { code = C[rule](v), message = M[rule](v) }
end

-- ---- parsing tres_per_* strings (submit/parse.py) ----

-- cpu=4, mem:2G, license/x:1 ...: a lower-case TRES name, then '=' or ':' (or '/' for a prefix).
local function is_passthrough(raw)
  local head, sep = string.match(raw, "^([a-z]+)([=:/])")
  if sep == "/" then
    return P.passthrough_prefixes[head] == true
  end
  return head ~= nil and P.passthrough_names[head] == true
end

-- string.find, not string.match: a yes/no test that builds no string.
local function is_count(s)
  return string.find(s, "^[0-9]+[kKmMgGtTpP]?$") ~= nil
end

local function is_negative(s)
  return string.find(s, "^%-[0-9]+$") ~= nil
end

local function parse_count(field, raw, text)
  if is_negative(text) then
    return nil, msg("negative", { field = field, raw = raw })
  end
  local digits, suffix = string.match(text, "^([0-9]+)([kKmMgGtTpP]?)$")
  if not digits then
    return nil, msg("not_count", { field = field, raw = raw, text = text })
  end
  if #digits > 10 and #(string.gsub(digits, "^0+", "")) > 10 then
    return nil, msg("too_many", { field = field, raw = raw, max = P.max_count })
  end
  local n = tonumber(digits)
  if n == 0 then
    return nil, msg("zero", { field = field, raw = raw })
  end
  local mult = 1
  if suffix ~= "" then
    mult = P.suffixes[string.lower(suffix)]
  end
  if n > math.floor(P.max_count / mult) then
    return nil, msg("too_many", { field = field, raw = raw, max = P.max_count })
  end
  return n * mult
end

-- (name/type parts, count text or nil, whether a type slot was written)
local function split_count(body)
  local eq, pos = nil, string.find(body, "=", 1, true)
  while pos do
    eq = pos
    pos = string.find(body, "=", pos + 1, true)
  end
  if eq then
    local parts = split(string.sub(body, 1, eq - 1), ":")
    return parts, string.sub(body, eq + 1), #parts >= 2
  end
  local parts = split(body, ":")
  local n = #parts
  if n == 3 or (n == 2 and (is_count(parts[2]) or is_negative(parts[2]))) then
    local count = parts[n]
    parts[n] = nil  -- the same table, without the count: no second one
    return parts, count, n == 3
  end
  return parts, nil, #parts >= 2
end

local function parse_entry(field, raw)
  local body = raw
  if string.find(raw, "^gres[/:]") then
    body = string.sub(raw, 6)  -- "gres" is no passthrough name, so this is a GRES entry
  elseif is_passthrough(raw) then
    return { raw = raw }
  end
  local parts, count_text, typed = split_count(body)
  local name = parts[1]
  if not P.gres_names[name] then
    return nil, msg("not_gres", { field = field, raw = raw, name = name, known = P.texts.gres_names })
  end
  if #parts > 2 then
    return nil, msg("bad_form", { field = field, raw = raw })
  end
  local gtype = ""
  if typed then
    gtype = parts[2]
    if #gtype > P.max_type_len or not string.find(gtype, "^[A-Za-z0-9][A-Za-z0-9_%.%-]*$") then
      return nil, msg("bad_type", { field = field, raw = raw, type = gtype, max = P.max_type_len })
    end
  end
  local count = 1
  if count_text then
    local n, err = parse_count(field, raw, count_text)
    if not n then
      return nil, err
    end
    count = n
  end
  return { gres = true, field = field, name = name, type = gtype, count = count, raw = raw, alias = "" }
end

local function parse_field(field, text)
  if type(text) ~= "string" then
    return nil, msg("not_string", { field = field })
  end
  if #text > P.max_len then
    return nil, msg("too_long", { field = field, size = #text, max = P.max_len })
  end
  if text == "" then
    return nil, msg("empty", { field = field })
  end
  local raws = split(text, ",")
  for _, raw in ipairs(raws) do
    if raw == "" then
      return nil, msg("empty_entry", { field = field, text = text })
    end
  end
  local entries = {}
  for i, raw in ipairs(raws) do
    local e, err = parse_entry(field, raw)
    if not e then
      return nil, err
    end
    entries[i] = e
  end
  return entries
end

-- ---- the decision (submit/decide.py) ----

local function key(e)
  if e.type ~= "" then
    return e.name .. ":" .. e.type
  end
  return e.name
end

-- gpu:<alias>:N -> the alias target, N times (an mps alias multiplies its units).
local function resolve_alias(e)
  if not e.gres or e.name ~= "gpu" then
    return e
  end
  local a = P.aliases[e.type]
  if not a then
    return e
  end
  return { gres = true, field = e.field, name = a.name, type = a.type, count = e.count * a.per, raw = e.raw, alias = e.type }
end

local function find_duplicate(field, entries)
  if #entries < 2 then
    return nil
  end
  local seen = {}  -- seen[name][type] = raw (no per-entry string building)
  for _, e in ipairs(entries) do
    if e.gres then
      local by_type = seen[e.name]
      if not by_type then
        by_type = {}
        seen[e.name] = by_type
      end
      local first = by_type[e.type]
      if first then
        return msg("twice", { field = field, key = key(e), first = first, raw = e.raw })
      end
      by_type[e.type] = e.raw
    end
  end
  return nil
end

local function unknown_gpu(gtype)
  local low = string.lower(gtype)
  local matches = {}
  for _, x in ipairs(P.gpu_types) do
    if string.sub(x, -(#low + 1)) == "_" .. low then
      matches[#matches + 1] = x
    end
  end
  local hint = ""
  if low ~= gtype and P.gpu_type_set[low] then
    hint = msg("hint_lower", { low = low })
  elseif #matches > 0 then
    hint = msg("hint_match", { matches = table.concat(matches, P.join.matches) })
  end
  local aliases = ""
  if P.texts.aliases ~= "" then
    aliases = msg("hint_aliases", { aliases = P.texts.aliases })
  end
  return violation("unknown_gpu", { type = gtype, hint = hint, types = P.texts.gpu_types, aliases = aliases })
end

local function multi_slice(r)
  if not P.reject_multi_slice then
    return nil
  end
  local unit = P.per[r.field]
  if unit then
    return violation("scope", { name = r.name, field = r.field, unit = unit, n = r.count })
  end
  if r.name == "shard" and r.count > 1 then
    return violation("over_shard", { n = r.count, whole = P.texts.whole })
  end
  return nil
end

local function check_request(r)
  if r.name == "gpu" then
    if r.type == "" or P.gpu_type_set[r.type] then
      return nil
    end
    return unknown_gpu(r.type)
  end
  local per = P.shared[r.name]
  if not per then
    return violation("unknown_shared", { key = key(r), name = r.name, offers = P.texts.offers })
  end
  if r.type ~= "" and not per[r.type] then
    return violation("unknown_shared_type", { key = key(r), name = r.name, type = r.type, types = P.texts[r.name .. "_types"] })
  end
  local most = per[r.type]
  if r.name == "mps" and r.count > most then
    return violation("mps_range", { n = r.count, most = most, whole = P.texts.whole })
  end
  return multi_slice(r)
end

local function check_mixed(reqs)
  if #reqs < 2 then
    return nil
  end
  local present, kinds = {}, {}
  for _, r in ipairs(reqs) do
    present[r.name] = true
  end
  for _, k in ipairs(P.kinds) do
    if present[k] then
      kinds[#kinds + 1] = k
    end
  end
  if #kinds < 2 then
    return nil
  end
  return { code = C.mixed({ kinds = table.concat(kinds, P.join.kinds_code) }),
           message = M.mixed({ kinds = table.concat(kinds, P.join.kinds) }) }
end

-- A task or node count from job_desc; nil when unset (0, Slurm's NO_VAL/NO_VAL16 or above, not a number).
local function count_of(value, unset)
  local n = tonumber(value)
  if n == nil or n <= 0 or n >= unset or n ~= math.floor(n) then
    return nil
  end
  return n
end

-- The most tasks the job may start on one node (submit/decide.py tasks_per_node).
local function tasks_per_node(job)
  local per_node = count_of(job.ntasks_per_node, 65534)
  if per_node then
    return per_node
  end
  local tasks = count_of(job.num_tasks, 4294967294)
  if not tasks then
    return 1
  end
  local nodes = count_of(job.min_nodes, 4294967294) or 1
  return math.max(1, tasks - nodes + 1)
end

-- MPS limits are per client process: several tasks on a node would each hold the job's share.
local function check_mps_tasks(job, reqs)
  local mps = nil
  for _, r in ipairs(reqs) do
    if mps == nil and r.name == "mps" then
      mps = r
    end
  end
  if mps == nil then
    return nil
  end
  local n = tasks_per_node(job)
  if n < 2 then
    return nil
  end
  return violation("mps_tasks", { n = fmt(n), units = mps.count, isolation = P.texts.isolation })
end

local function serves(tier, r)
  if r.name == "gpu" then
    if r.type ~= "" then
      return tier.gpu_set[r.type] == true or (tier.slices ~= nil and tier.slices[r.type] ~= nil)
    end
    return #tier.gpu > 0
  end
  local per = tier.shared[r.name]
  return per ~= nil and per[r.type] ~= nil and r.count <= per[r.type]
end

local function serves_all(tier, reqs)
  for _, r in ipairs(reqs) do
    if not serves(tier, r) then
      return false
    end
  end
  return true
end

-- ---- the job's --constraint (submit/constraint.py): GPU models are node features ----

-- { text, names (each once, in order), op: "|" any (also one name), "&" all, "" not read }; nil: none, or too long.
local function read_constraint(text)
  if type(text) ~= "string" or text == "" or #text > P.max_len then
    return nil
  end
  local names, seen = {}, {}
  for piece in string.gmatch(text, "[^&|()%[%]]+") do
    local n = (string.gsub(piece, "%*[0-9]*$", ""))
    if n ~= "" and not seen[n] then
      seen[n] = true
      names[#names + 1] = n
    end
  end
  local ands = string.find(text, "&", 1, true) ~= nil
  local ors = string.find(text, "|", 1, true) ~= nil
  local op = "|"
  if ands and ors then
    op = ""
  elseif ands then
    op = "&"
  end
  return { text = text, names = names, op = op }
end

local function allows(con, features)
  if con.op == "|" then
    for _, n in ipairs(con.names) do
      if features[n] then
        return true
      end
    end
    return false
  end
  if con.op == "&" then
    for _, n in ipairs(con.names) do
      if not features[n] then
        return false
      end
    end
  end
  return true
end

-- The node groups a constraint allows, as a set of names; nil when it narrows nothing.
local function allowed_of(con)
  if con == nil or con.op == "" then
    return nil
  end
  local out = {}
  for _, tier in ipairs(P.tiers) do
    for _, g in ipairs(tier.groups) do
      if allows(con, g.feature_set) then
        out[g.name] = true
      end
    end
  end
  return out
end

-- What these groups serve together: GPU types joined (sorted), shared caps at their largest.
local function merged(groups)
  local gpu, gpu_set, shared, slices, whole, whole_set = {}, {}, {}, {}, {}, {}
  for _, g in ipairs(groups) do
    for x, v in pairs(g.slices or NONE) do
      slices[x] = v
    end
    for _, x in ipairs(g.gpu) do
      if not gpu_set[x] then
        gpu_set[x] = true
        gpu[#gpu + 1] = x
      end
    end
    for _, x in ipairs(g.whole) do
      if not whole_set[x] then
        whole_set[x] = true
        whole[#whole + 1] = x
      end
    end
    for kind, per in pairs(g.shared) do
      local mine = shared[kind]
      if not mine then
        mine = {}
        shared[kind] = mine
      end
      for k, n in pairs(per) do
        if mine[k] == nil or n > mine[k] then
          mine[k] = n
        end
      end
    end
  end
  table.sort(gpu)
  table.sort(whole)
  return { gpu = gpu, gpu_set = gpu_set, shared = shared, slices = slices, whole = whole, whole_set = whole_set }
end

-- What the tier serves on the groups a constraint allows (the whole tier when it allows all).
local function within(tier, allowed)
  if allowed == nil then
    return tier
  end
  local groups = {}
  for _, g in ipairs(tier.groups) do
    if allowed[g.name] then
      groups[#groups + 1] = g
    end
  end
  local caps = merged(groups)
  caps.untyped = tier.untyped
  return caps
end

-- ---- an untyped gpu request means a whole GPU (decide.py rule 5b) ----

local function all_whole(caps)
  for _, x in ipairs(caps.gpu) do
    if not caps.whole_set[x] then
      return false
    end
  end
  return true
end

-- What an untyped gpu request becomes on a tier (decide.untyped_target): "" left as it is, a type, nil refused.
local function untyped_target(tier, caps, set_type)
  if tier.untyped == "refuse" then
    return nil
  end
  if tier.untyped ~= "whole" then
    if caps.gpu_set[tier.untyped] then
      return tier.untyped
    end
    return nil
  end
  if all_whole(caps) then
    if set_type and #caps.gpu == 1 then
      return caps.gpu[1]
    end
    return ""
  end
  if #caps.whole == 1 then
    return caps.whole[1]
  end
  return nil
end

-- One target for all the job's tiers (decide.jobs_target): theirs when they agree, "" when they differ and each
-- serves only whole GPUs, nil when refused.
local function jobs_target(tiers, allowed)
  if #tiers == 0 then
    return ""
  end
  local first, same, whole = nil, true, true
  for i, tier in ipairs(tiers) do
    local caps = within(tier, allowed)
    local x = untyped_target(tier, caps, P.set_gpu_type)
    if x == nil then
      return nil
    end
    if i == 1 then
      first = x
    elseif x ~= first then
      same = false
    end
    whole = whole and all_whole(caps)
  end
  if same then
    return first
  end
  if whole then
    return ""
  end
  return nil
end

local function joined_or_none(list)
  if #list == 0 then
    return P.join.none
  end
  return table.concat(list, P.join.offers)
end

-- UNTYPED where each of the job's tiers gives the request a meaning, but not the same one (decide._untyped_apart).
local function untyped_apart(r, tiers, targets, allowed)
  local meanings, example, fallback = {}, nil, nil
  for i, tier in ipairs(tiers) do
    local whole = within(tier, allowed).whole
    local types = targets[i]
    if types == "" then
      types = joined_or_none(whole)
    elseif example == nil then
      example = types
    end
    if fallback == nil and #whole > 0 then
      fallback = whole[1]
    end
    meanings[i] = msg("untyped_tier", { tier = tier.name, types = types })
  end
  local reason = msg("untyped_tiers", { meanings = table.concat(meanings, P.join.tiers) })
  return violation("untyped", { key = r.raw, tier = tiers[1].name, reason = reason,
                                example = example or fallback or P.join.none, n = fmt(r.count) })
end

-- UNTYPED: the tier that refuses the untyped request, why, and a typed request to make instead
-- (decide.untyped_violation).
local function untyped_violation(r, tiers, allowed)
  local targets, tier = {}, nil
  for i, x in ipairs(tiers) do
    targets[i] = untyped_target(x, within(x, allowed), P.set_gpu_type)
    if targets[i] == nil and tier == nil then
      tier = x
    end
  end
  if tier == nil then
    return untyped_apart(r, tiers, targets, allowed)
  end
  local caps = within(tier, allowed)
  local reason, example
  if tier.untyped == "refuse" then
    reason = msg("untyped_refuse", NONE)
  elseif tier.untyped ~= "whole" then
    reason, example = msg("untyped_excluded", { type = tier.untyped }), tier.untyped
  else
    local others = {}
    for _, x in ipairs(caps.gpu) do
      if not caps.whole_set[x] then
        others[#others + 1] = x
      end
    end
    reason = msg("untyped_whole", { whole = joined_or_none(caps.whole), others = joined_or_none(others) })
  end
  if example == nil then
    example = caps.whole[1] or caps.gpu[1] or P.join.none
  end
  return violation("untyped", { key = r.raw, tier = tier.name, reason = reason, example = example, n = fmt(r.count) })
end

-- Routing may pick this tier for r: it serves it, and gives an untyped gpu request its meaning (decide.routable).
local function routable_all(caps, reqs)
  for _, r in ipairs(reqs) do
    if not serves(caps, r) then
      return false
    end
    if r.name == "gpu" and r.type == "" and untyped_target(caps, caps, P.set_gpu_type) == nil then
      return false
    end
  end
  return true
end

local function unknown_feature(name)
  local low = string.lower(name)
  local hint = ""
  if low ~= name and P.feature_set[low] then
    hint = msg("hint_feature_lower", { low = low })
  end
  local more = ""
  if P.texts.other_features ~= "" then
    more = msg("hint_other_features", { features = P.texts.other_features })
  end
  return violation("unknown_feature", { name = name, hint = hint, models = P.texts.model_features, others = more })
end

local function check_constraint(con, reqs)
  local out = nil
  for _, n in ipairs(con.names) do
    if not P.feature_set[n] then
      out = out or {}
      out[#out + 1] = unknown_feature(n)
    end
  end
  if out then
    return out
  end
  local allowed = allowed_of(con)
  if allowed == nil then
    return nil
  end
  local groups, has_model = {}, {}
  for _, tier in ipairs(P.tiers) do
    for _, g in ipairs(tier.groups) do
      if allowed[g.name] then
        groups[#groups + 1] = g
        has_model[g.model] = true
      end
    end
  end
  if #groups == 0 then
    return { violation("constraint_none", { constraint = con.text, models = P.texts.model_features,
                                            example = P.texts.constraint_example }) }
  end
  local caps = merged(groups)
  local offers, models, kinds = {}, {}, {}
  for _, x in ipairs(caps.gpu) do
    offers[#offers + 1] = "gpu:" .. x
  end
  for kind, _ in pairs(caps.shared) do
    kinds[#kinds + 1] = kind
  end
  table.sort(kinds)
  for _, kind in ipairs(kinds) do
    offers[#offers + 1] = kind
  end
  for _, m in ipairs(P.model_features) do
    if has_model[m] then
      models[#models + 1] = m
    end
  end
  for _, r in ipairs(reqs) do
    if not serves(caps, r) then
      out = out or {}
      out[#out + 1] = violation("constraint_request", { key = key(r), constraint = con.text,
                                                        models = table.concat(models, ", "),
                                                        offers = table.concat(offers, P.join.offers) })
    end
  end
  return out
end

-- The first tier (routing order) whose allowed groups pass test(caps, reqs): routable_all, then serves_all (none
-- gives an untyped request its meaning: the first that serves it says why, UNTYPED; decide.job_tiers).
local function route_by_gres(reqs, allowed, test)
  for _, tier in ipairs(P.tiers) do
    if test(within(tier, allowed), reqs) then
      return tier
    end
  end
  return nil
end

-- The tiers the job can run in, and the partition to set (nil: leave it).
local function job_tiers(partition, reqs, modify, allowed)
  if partition ~= nil and partition ~= "" then
    if P.tier_index[partition] then
      return ONLY[partition], nil
    end
    local tiers = {}
    for _, p in ipairs(split(partition, ",")) do
      local i = P.tier_index[p]
      if not i then
        return {}, nil
      end
      tiers[#tiers + 1] = P.tiers[i]
    end
    return tiers, nil
  end
  if P.route_by_gres and not modify then
    local tier = route_by_gres(reqs, allowed, routable_all) or route_by_gres(reqs, allowed, serves_all)
    if tier then
      if tier.is_default then
        return ONLY[tier.name], nil
      end
      return ONLY[tier.name], tier.name
    end
  end
  return ONLY[P.tiers[P.default_tier].name], nil
end

local function sets_type(e, set_type)
  return set_type and e.name == "gpu" and e.type == ""
end

local function field_changes(entries, set_type)
  for _, e in ipairs(entries) do
    if e.gres and (e.alias ~= "" or sets_type(e, set_type)) then
      return true
    end
  end
  return false
end

-- A changed field is written again whole, in this Slurm's format: <prefix>name[:type]:count.
local function serialise(entries, set_type, only)
  local parts = {}
  for i, e in ipairs(entries) do
    if e.gres then
      local t = e.type
      if sets_type(e, set_type) then
        t = only
      end
      local typed = ""
      if t ~= "" then
        typed = ":" .. t
      end
      parts[i] = P.prefix .. e.name .. typed .. ":" .. fmt(e.count)
    else
      parts[i] = e.raw
    end
  end
  return table.concat(parts, ",")
end

-- The QOS to set for a new job that names none (decide.tier_qos, rule 6): its (first) tier's, as the tier's
-- set_qos says; "if-allowed": only when job_desc.assoc_qos (the association's QOS, comma-separated) lists it.
local function tier_qos(job, tiers, modify)
  if modify or (job.qos ~= nil and job.qos ~= "") or #tiers == 0 or tiers[1].set_qos == "never" then
    return nil
  end
  local name = tiers[1].name
  if tiers[1].set_qos == "always" then
    return name
  end
  local allowed = job.assoc_qos
  if type(allowed) ~= "string" then
    return nil
  end
  local want = string.lower(name)
  for q in string.gmatch(allowed, "[^,]+") do
    if string.lower((string.gsub(q, "^%s*(.-)%s*$", "%1"))) == want then
      return name
    end
  end
  return nil
end

local function first_untyped(reqs)
  for _, r in ipairs(reqs) do
    if r.name == "gpu" and r.type == "" then
      return r
    end
  end
  return nil
end

-- Per-job tiers own the extra field (decide.own_extra): a violation for a job on one that brings its own (a
-- non-empty extra), and for an update that sets it (even to "") on a job there or one that carries the record;
-- nil otherwise. A site without per-job GPUs has no record_prefix in its prelude and checks nothing.
local function own_extra(tiers, job, modify, current_extra, where)
  if P.record_prefix == nil then
    return nil
  end
  local mine = job[P.record_field]
  if mine == nil or (mine == "" and not modify) then
    return nil
  end
  local first = nil
  for _, x in ipairs(tiers) do
    if first == nil and x.slices then
      first = x.name
    end
  end
  local carries = modify and type(current_extra) == "string"
    and string.sub(current_extra, 1, #P.record_prefix) == P.record_prefix
  if first == nil and not carries then
    return nil
  end
  if where == nil or where == "" then
    where = first or ""
  end
  return violation("per_job_extra", { partition = where })
end

-- Per-job MIG (decide.per_job): a slice type on a per-job tier becomes its carrier shards (parsed is changed in
-- place); returns violations or nil, and the extra field's record of the profile (nil: none). A tier without
-- per-job GPUs has no slices table, and the prelude of a site without any has none of per-job MIG's texts.
local function per_job(tiers, parsed, reqs, where)
  local slicing = {}
  for _, x in ipairs(tiers) do
    if x.slices then
      slicing[#slicing + 1] = x
    end
  end
  if #slicing == 0 then
    return nil, nil
  end
  if where == nil or where == "" then
    where = slicing[1].name
  end
  for _, e in ipairs(reqs) do
    if e.name == "shard" then
      return { violation("per_job_shard", { partition = where, example = slicing[1].slice_example }) }, nil
    end
  end
  local r, gpus = nil, 0
  for _, e in ipairs(reqs) do
    if e.name == "gpu" then
      gpus = gpus + e.count
      for _, x in ipairs(tiers) do
        if r == nil and x.slices and x.slices[e.type] then
          r = e
        end
      end
    end
  end
  if r == nil then
    return nil, nil
  end
  if #slicing < #tiers then
    return { violation("per_job_tiers", { type = r.type, partition = where }) }, nil
  end
  if r.field ~= "tres_per_node" then
    return { violation("per_job_field", { type = r.type, field = r.field }) }, nil
  end
  if gpus > 1 then
    return { violation("per_job_count", { type = r.type, n = fmt(gpus) }) }, nil
  end
  local s = slicing[1].slices[r.type]
  local alias = r.alias
  if alias == "" then
    alias = r.type
  end
  local entries = parsed[r.field]
  for i, e in ipairs(entries) do
    if e == r then
      entries[i] = { gres = true, field = r.field, name = "shard", type = "", count = s.weight, raw = r.raw, alias = alias }
    end
  end
  return nil, P.record_prefix .. s.profile
end

local function place(job, parsed, order, reqs, modify, current, route, allowed, current_extra)
  local where = job.partition
  if (where == nil or where == "") and modify then
    where = current
  end
  local partition = job.partition
  if modify and (partition == nil or partition == "") then
    partition = current
  end
  local to = nil
  if route and route.partition ~= "" then
    to = route.partition -- a class route names the tiers
    partition = to
  end
  local tiers, new_partition = job_tiers(partition, reqs, modify, allowed)
  if new_partition == nil then
    new_partition = to
  end
  -- what an untyped gpu request becomes (rule 5b), or why it is refused
  local untyped, only = first_untyped(reqs), ""
  if untyped then
    only = jobs_target(tiers, allowed)
    if only == nil then
      return { accepted = false, fields = EMPTY, violations = { untyped_violation(untyped, tiers, allowed) } }
    end
  end
  local set_type = only ~= ""
  local own = own_extra(tiers, job, modify, current_extra, where)
  if own then
    return { accepted = false, violations = { own }, fields = EMPTY }
  end
  local bad, record = per_job(tiers, parsed, reqs, where)
  if bad then
    return { accepted = false, violations = bad, fields = EMPTY }
  end
  local fields = EMPTY
  for _, f in ipairs(order) do
    if field_changes(parsed[f], set_type) then
      if fields == EMPTY then
        fields = {}
      end
      fields[#fields + 1] = { f, serialise(parsed[f], set_type, only) }
    end
  end
  return {
    accepted = true,
    violations = EMPTY,
    partition = new_partition,
    fields = fields,
    qos = tier_qos(job, tiers, modify),
    extra = record,
  }
end

-- 'none' (what sbatch sends for --gres=none) asks for no GRES; in an update, so does "".
local function no_gres(text, modify)
  return type(text) == "string" and (string.lower(text) == "none" or (modify and text == ""))
end

-- ---- class routing (submit/routes.py): first matching route; an mps share may become a MIG slice ----

local function job_cpus(job)
  local n = tonumber(job.min_cpus)
  if n == nil or n <= 0 or n >= 4294967294 then
    return 1
  end
  return n
end

local function find_route(job, reqs, modify)
  if modify or (job.partition ~= nil and job.partition ~= "") or #P.routes == 0 then
    return nil
  end
  local kind, gpus = "none", 0
  if #reqs > 0 then
    kind = reqs[1].name
  end
  for _, r in ipairs(reqs) do
    if r.name == "gpu" then
      gpus = gpus + r.count
    end
  end
  local qos = string.lower(job.qos or "")
  local cpus = job_cpus(job)
  for _, route in ipairs(P.routes) do
    if route.gres == kind and cpus >= route.min_cpus and (next(route.qos) == nil or route.qos[qos])
        and (kind ~= "gpu" or (gpus >= route.min_gpus and (route.max_gpus == 0 or gpus <= route.max_gpus))) then
      return route
    end
  end
  return nil
end

-- mps:N -> gpu:<smallest type covering N %>:1 (unchanged when nothing covers it)
local function round_entry(route, e)
  if not route.round_mig or not e.gres or e.name ~= "mps" then
    return e
  end
  for _, c in ipairs(route.cover) do
    if c.pct >= e.count then
      local alias = e.alias
      if alias == "" then
        alias = "mps"
      end
      return { gres = true, field = e.field, name = "gpu", type = c.type, count = 1, raw = e.raw, alias = alias }
    end
  end
  return e
end

local function decide(job, modify, current, current_extra)
  local parsed, order, bad = {}, {}, nil
  for _, f in ipairs(P.fields) do
    local text = job[f]
    if text ~= nil and not no_gres(text, modify) then
      local entries, err = parse_field(f, text)
      if entries then
        for i, e in ipairs(entries) do
          entries[i] = resolve_alias(e)
        end
        err = find_duplicate(f, entries)
      end
      if err then
        bad = bad or {}
        bad[#bad + 1] = { code = C.bad_request({ field = f }), message = err }
      else
        parsed[f] = entries
        order[#order + 1] = f
      end
    end
  end
  if bad then
    return { accepted = false, violations = bad, fields = EMPTY }
  end
  local reqs = {}
  for _, f in ipairs(order) do
    for _, e in ipairs(parsed[f]) do
      if e.gres then
        reqs[#reqs + 1] = e
      end
    end
  end
  local route = find_route(job, reqs, modify)
  if route and route.round_mig then
    reqs = {}
    for _, f in ipairs(order) do
      for i, e in ipairs(parsed[f]) do
        parsed[f][i] = round_entry(route, e)
        if parsed[f][i].gres then
          reqs[#reqs + 1] = parsed[f][i]
        end
      end
    end
  end
  if #reqs == 0 then
    local partition = job.partition
    if modify and (partition == nil or partition == "") then
      partition = current
    end
    local to = nil
    if route and route.partition ~= "" then
      to = route.partition
      partition = to
    end
    local tiers = job_tiers(partition, reqs, true)
    local where = job.partition
    if (where == nil or where == "") and modify then
      where = current
    end
    local own = own_extra(tiers, job, modify, current_extra, where)
    if own then
      return { accepted = false, violations = { own }, fields = EMPTY }
    end
    return { accepted = true, violations = EMPTY, partition = to, fields = EMPTY, qos = tier_qos(job, tiers, modify) }
  end
  local violations = nil
  for _, r in ipairs(reqs) do
    local v = check_request(r)
    if v then
      violations = violations or {}
      violations[#violations + 1] = v
    end
  end
  local mixed = check_mixed(reqs)
  if mixed then
    violations = violations or {}
    violations[#violations + 1] = mixed
  end
  local tasks = check_mps_tasks(job, reqs)
  if tasks then
    violations = violations or {}
    violations[#violations + 1] = tasks
  end
  if violations then
    return { accepted = false, violations = violations, fields = EMPTY }
  end
  local con = read_constraint(job.features)
  local allowed = nil
  if con then
    local bad_constraint = check_constraint(con, reqs)
    if bad_constraint then
      return { accepted = false, violations = bad_constraint, fields = EMPTY }
    end
    allowed = allowed_of(con)
  end
  return place(job, parsed, order, reqs, modify, current, route, allowed, current_extra)
end

-- ---- telling the user, changing the job, return codes ----

local function user_message(d)
  if d.accepted and not d.partition and #d.fields == 0 then
    return nil
  end
  if #d.violations > 0 then
    local lines = { msg("rejected", NONE) }
    for _, v in ipairs(d.violations) do
      lines[#lines + 1] = M.violation(v)
    end
    return table.concat(lines, P.join.lines)
  end
  local changes = {}
  if d.partition then
    changes[#changes + 1] = M.change({ name = "partition", value = d.partition })
  end
  for _, kv in ipairs(d.fields) do
    changes[#changes + 1] = M.change({ name = kv[1], value = kv[2] })
  end
  if d.extra then
    changes[#changes + 1] = M.change({ name = P.record_field, value = d.extra })
  end
  if #changes > 0 then
    return msg("changed", { changes = table.concat(changes, P.join.changes) })
  end
  return nil
end

local function codes(d)
  local out = {}
  for _, v in ipairs(d.violations) do
    out[#out + 1] = v.code
  end
  return table.concat(out, P.join.log_codes)
end

local function run(job_desc, modify, current, uid, current_extra)
  local d = decide(job_desc, modify, current, current_extra)
  local text = user_message(d)
  if not d.accepted then
    slurm.log_info("%s", msg("log_rejected", { uid = tostring(uid), codes = codes(d) }))
    slurm.log_user("%s", text)
    return slurm.ESLURM_INVALID_GRES or slurm.ERROR
  end
  if d.partition then
    job_desc.partition = d.partition
  end
  for _, kv in ipairs(d.fields) do
    job_desc[kv[1]] = kv[2]
  end
  if d.qos then
    job_desc.qos = d.qos
  end
  if d.extra then
    job_desc[P.record_field] = d.extra
  end
  if text then
    slurm.log_info("%s", msg("log_changed", { uid = tostring(uid), message = text }))
    slurm.log_user("%s", text)
  end
  return slurm.SUCCESS
end

-- returned: fn ran but err is what it returned instead of a return code.
local function internal_error(where, err, returned)
  if returned then
    err = msg("bad_return", { value = tostring(err) })
  end
  local text = msg("internal", { where = where, error = tostring(err) })
  if FAIL_OPEN then
    slurm.log_error("%s", msg("internal_open", { text = text }))
    return slurm.SUCCESS
  end
  slurm.log_error("%s", msg("internal_closed", { text = text }))
  slurm.log_user("%s", msg("internal_user", { error = tostring(err) }))
  return slurm.ERROR
end

-- Run fn under pcall; anything but a numeric return code is an internal error.
local function guarded(where, fn, a, b, c, d)
  local ok, rc = pcall(fn, a, b, c, d)
  if ok and type(rc) == "number" then
    return rc
  end
  local ok2, rc2 = pcall(internal_error, where, rc, ok)
  if ok2 and type(rc2) == "number" then
    return rc2
  end
  -- Even the error path failed: 0 (SUCCESS) or -1 (SLURM_ERROR), never nil, which would let the job through.
  if FAIL_OPEN then
    return 0
  end
  return -1
end

local function modify_job(job_desc, job_rec, uid)
  local current, current_extra = nil, nil
  if job_rec ~= nil then
    current = job_rec.partition
    current_extra = job_rec.extra
  end
  return run(job_desc, true, current, uid, current_extra)
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  return guarded("slurm_job_submit", run, job_desc, false, nil, submit_uid)
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return guarded("slurm_job_modify", modify_job, job_desc, job_rec, modify_uid)
end

-- A site's own job_submit.lua (policy submission.site_lua), kept as a module and run before or after
-- these rules: the first that does not return SUCCESS decides. An error inside it rejects the job
-- (slurmctld would let it through past our rules).
if P.site_lua ~= nil then
  local ours_submit, ours_modify = slurm_job_submit, slurm_job_modify
  slurm_job_submit, slurm_job_modify = nil, nil
  dofile(P.site_lua.path)
  local site_submit, site_modify = slurm_job_submit, slurm_job_modify
  local function site_guarded(fn, where)
    if fn == nil then
      return nil
    end
    return function(...)
      local ok, rc = pcall(fn, ...)
      if ok and type(rc) == "number" then
        return rc
      end
      slurm.log_error("%s", msg("site_lua_error", { path = P.site_lua.path, where = where, error = tostring(rc) }))
      slurm.log_user("%s", msg("site_lua_user", {}))
      return slurm.ERROR
    end
  end
  local function chain(first, second)
    return function(...)
      if first ~= nil then
        local rc = first(...)
        if rc ~= slurm.SUCCESS then
          return rc
        end
      end
      if second == nil then
        return slurm.SUCCESS
      end
      return second(...)
    end
  end
  site_submit = site_guarded(site_submit, "slurm_job_submit")
  site_modify = site_guarded(site_modify, "slurm_job_modify")
  if P.site_lua.order == "after" then
    slurm_job_submit, slurm_job_modify = chain(ours_submit, site_submit), chain(ours_modify, site_modify)
  else
    slurm_job_submit, slurm_job_modify = chain(site_submit, ours_submit), chain(site_modify, ours_modify)
  end
end
