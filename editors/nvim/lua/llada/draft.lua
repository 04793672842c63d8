--- Live drafts: tracks the pending textDocument/inlineCompletion of each buffer and renders its
--- `llada/draft` notifications as ghost text. Knows nothing about who sent the request.
local api = vim.api
local ghost = require('llada.ghost')

local M = {}

local INLINE = 'textDocument/inlineCompletion'

---@class llada.PendingInline
---@field client_id integer
---@field id integer request id, which drafts name as `requestId`
---@field tick integer changedtick when the request was sent
---@field cursor? [integer, integer] cursor when the request was sent; nil if no window showed the buffer

local pending = {} ---@type table<integer, llada.PendingInline>
--- Requests cancelled by cancel(), per buffer, with what to run once their reply has been handled.
local cancelled = {} ---@type table<integer, {client_id: integer, id: integer, on_reply?: fun()}>

---@param bufnr integer
---@return boolean
function M.is_pending(bufnr)
  return pending[bufnr] ~= nil
end

---@param bufnr integer
function M.forget(bufnr)
  pending[bufnr] = nil
  cancelled[bufnr] = nil
end

local function redraw_status()
  vim.schedule(function()
    vim.cmd.redrawstatus()
  end)
end

--- LspRequest autocmd: remembers the latest inline request per buffer, forgets it once answered.
---@param args {buf: integer, data: {client_id: integer, request_id: integer, request: {type: string, bufnr: integer, method: string}}}
function M.on_request(args)
  local data = args.data
  local client = vim.lsp.get_client_by_id(data.client_id)
  if data.request.method ~= INLINE or not client or client.name ~= 'llada' then
    return
  end
  local bufnr = data.request.bufnr
  local dropped = cancelled[bufnr]
  if
    dropped
    and data.request.type == 'complete'
    and dropped.client_id == data.client_id
    and dropped.id == data.request_id
  then
    cancelled[bufnr] = nil
    -- The reply's handler was scheduled before this autocmd ran; run after it.
    if dropped.on_reply then
      vim.schedule(dropped.on_reply)
    end
  end
  if data.request.type == 'pending' then
    -- Runs synchronously inside client:request(), so the cursor is the one the request was made at.
    local win = ghost.insert_window(bufnr)
    pending[bufnr] = {
      client_id = data.client_id,
      id = data.request_id,
      tick = api.nvim_buf_get_changedtick(bufnr),
      cursor = win and api.nvim_win_get_cursor(win),
    }
  elseif pending[bufnr] and pending[bufnr].id == data.request_id then
    pending[bufnr] = nil
    -- The built-in completer draws the answer in its own namespace right after this, in place of the
    -- plugin's ghost (a draft, or the rest of a partly accepted suggestion, which the answer revises);
    -- the fallback completer replaces it itself.
    if not ghost.is_fallback(bufnr) and ghost.shown(bufnr) then
      ghost.clear(bufnr)
    end
  end
  redraw_status()
end

--- Cancels the pending inline request of {bufnr}: no more of its drafts are drawn. {on_reply} runs once
--- the reply to it (the cancel acknowledgement, or an answer that was already on its way) has been handled
--- by whoever sent the request.
---@param bufnr integer
---@param on_reply? fun()
function M.cancel(bufnr, on_reply)
  local p = pending[bufnr]
  pending[bufnr] = nil
  local client = p and vim.lsp.get_client_by_id(p.client_id)
  local sent = client and client.requests[p.id]
  if sent and sent.type == 'pending' then
    cancelled[bufnr] = { client_id = p.client_id, id = p.id, on_reply = on_reply }
    client:cancel_request(p.id)
  end
  redraw_status()
end

--- The buffer a draft is for: one with a pending request from this client and this uri.
---@param uri string
---@param client_id integer
---@return integer?
local function pending_buffer(uri, client_id)
  for bufnr, p in pairs(pending) do
    if p.client_id == client_id and api.nvim_buf_is_valid(bufnr) and vim.uri_from_bufnr(bufnr) == uri then
      return bufnr
    end
  end
end

--- Handler of the `llada/draft` notification (docs/protocol.md, "Live drafts").
---@param params {uri: string, version: integer, requestId: integer|string, step: integer, final: boolean, range: lsp.Range, text: string}
---@param ctx lsp.HandlerContext
function M.on_draft(_, params, ctx)
  local bufnr = pending_buffer(params.uri, ctx.client_id)
  if not bufnr then
    return
  end
  local function render()
    local p = pending[bufnr]
    local client = vim.lsp.get_client_by_id(ctx.client_id)
    local win = ghost.insert_window(bufnr)
    -- A draft is drawn only for the text and cursor its request saw; anything else is stale.
    if
      not api.nvim_buf_is_valid(bufnr)
      or not p
      or not client
      or not win
      or tostring(p.id) ~= tostring(params.requestId)
      or params.version ~= vim.lsp.util.buf_versions[bufnr]
      or api.nvim_buf_get_changedtick(bufnr) ~= p.tick
      or not vim.deep_equal(api.nvim_win_get_cursor(win), p.cursor)
    then
      return
    end
    local at = vim.lsp.util.make_position_params(win, client.offset_encoding).position
    local start = params.range.start
    if start.line ~= at.line or start.character ~= at.character then
      return
    end
    if not ghost.is_fallback(bufnr) then
      -- The built-in completer may still show the previous answer at this cursor; the draft supersedes it.
      api.nvim_buf_clear_namespace(bufnr, api.nvim_create_namespace('nvim.lsp.inline_completion'), 0, -1)
    end
    ghost.show(bufnr, p.cursor[1] - 1, p.cursor[2], params.text, 'draft')
    api.nvim_exec_autocmds('User', {
      pattern = 'LladaDraft',
      modeline = false,
      data = { bufnr = bufnr, step = params.step, final = params.final, text = params.text },
    })
  end
  -- Notification handlers already run on the main loop, in arrival order. Scheduling once more
  -- would let the answer (which clears the pending request) overtake the final draft.
  if vim.in_fast_event() then
    vim.schedule(render)
  else
    render()
  end
end

return M
