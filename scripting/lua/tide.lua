-- The `tide` module every recipe sees. Presets fill a family's defaults; any field
-- given by the recipe wins. Called with the C helper `where(level)` as its argument.
local where = ...
local tide = { version = "0.1" }

local function copy(t)
  local out = {}
  for k, v in pairs(t) do
    if type(v) == "table" then out[k] = copy(v) else out[k] = v end
  end
  return out
end

local function with_defaults(name, defaults, t)
  if t == nil then t = {} end
  if type(t) ~= "table" then error(name .. " expects a table, got " .. type(t), 3) end
  local out = copy(defaults)
  for k, v in pairs(t) do out[k] = v end
  out.__where = where(3)
  return out
end

local LLAMA = {
  family = "llama", norm = "rmsnorm", norm_eps = 1e-5, positions = "rope", rope_theta = 10000,
  mlp = "swiglu", multiple_of = 256, attention_bias = false, mlp_bias = false,
  embedding_norm = false, tie_embeddings = false, init_std = 0.02,
}
-- LLaMA's architecture as Gemma builds it: a GeGLU MLP, norms multiplying by 1 + weight,
-- tied embeddings scaled by sqrt(dim) on the way in.
local GEMMA = {
  family = "llama", norm = "rmsnorm", norm_eps = 1e-6, norm_zero_centered = true, positions = "rope",
  rope_theta = 10000, mlp = "geglu", multiple_of = 256, attention_bias = false, mlp_bias = false,
  embedding_norm = false, tie_embeddings = true, init_std = 0.02,
}
-- Gemma 2 adds norms after attention and the MLP, soft-capped attention scores (50) and
-- logits (30), and layers that alternate: the even ones over a sliding window, the odd
-- ones in full, all with one RoPE base.
local GEMMA2 = copy(GEMMA)
GEMMA2.post_norms, GEMMA2.attention_softcap, GEMMA2.final_logit_softcap = true, 50, 30
GEMMA2.sliding_window = 4096
-- Gemma 3 adds norms after attention and the MLP, query/key norms, and layers of two
-- kinds: five over a sliding window (RoPE base 10^4, unscaled) for every one attending
-- in full (base 10^6, and rope_scaling where a recipe gives one).
local GEMMA3 = copy(GEMMA)
GEMMA3.post_norms, GEMMA3.qk_norm = true, true
GEMMA3.rope_theta, GEMMA3.rope_local_theta, GEMMA3.sliding_window = 1e6, 10000, 4096
local BLOOM = {
  family = "bloom", norm = "layernorm", norm_eps = 1e-5, positions = "alibi", mlp = "gelu",
  attention_bias = true, mlp_bias = true, embedding_norm = true, tie_embeddings = true,
  init_std = 0.02,
}

-- Gemma's embeddings are scaled by sqrt(dim) unless the recipe says otherwise.
local function gemma_scale(m)
  if m.embedding_scale == nil and type(m.dim) == "number" and m.dim > 0 then m.embedding_scale = math.sqrt(m.dim) end
  return m
end

-- Every n-th layer attends in full (layers n - 1, 2n - 1, ... from 0) unless the recipe
-- lists its own.
local function every_nth_full(m, n)
  if m.full_attention_layers == nil and type(m.n_layers) == "number" then
    local full = {}
    for i = n - 1, m.n_layers - 1, n do full[#full + 1] = i end
    m.full_attention_layers = full
  end
  return m
end

-- Not tail calls: `where` must still see the recipe's frame three levels up.
tide.models = {
  llama = function(t) local m = with_defaults("tide.models.llama", LLAMA, t); return m end,
  bloom = function(t) local m = with_defaults("tide.models.bloom", BLOOM, t); return m end,
  gemma = function(t)
    local m = with_defaults("tide.models.gemma", GEMMA, t)
    return gemma_scale(m)
  end,
  gemma2 = function(t)
    -- Layers 1, 3, 5, ... (from 0) attend in full.
    return every_nth_full(gemma_scale(with_defaults("tide.models.gemma2", GEMMA2, t)), 2)
  end,
  gemma3 = function(t)
    -- Layers 5, 11, 17, ... (from 0) attend in full: Gemma 3's sliding_window_pattern 6.
    return every_nth_full(gemma_scale(with_defaults("tide.models.gemma3", GEMMA3, t)), 6)
  end,
}

-- Marks the table as a recipe. (`return tide.recipe{...}` is a tail call, so the
-- recipe's own frame is gone by now: C++ finds its line in the source text.)
function tide.recipe(t)
  if type(t) ~= "table" then error("tide.recipe expects a table, got " .. type(t), 2) end
  t.__recipe = true
  return t
end

return tide
