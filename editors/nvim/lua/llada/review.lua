--- Review of the server's workspace/applyEdit: shows the proposed change as a diff in a float, asks
--- whether to apply it, and leaves the edit itself to Neovim's own handler. Knows nothing about rewrites.
local api = vim.api

local M = {}

M.DISCARDED = 'Discarded in the editor.'
M.UNCHANGED = 'The edit changes nothing.'
M.MOVED_ON = 'The document changed during the review.'

---@class llada.DocumentEdit
---@field uri string
---@field version? integer nil when the edit names no version
---@field edits lsp.TextEdit[]

--- The text edits of {edit} per document; resource operations (create, rename, delete) as notes.
---@param edit lsp.WorkspaceEdit
---@return llada.DocumentEdit[] documents
---@return string[] notes
local function document_edits(edit)
  local documents, notes = {}, {}
  for _, change in ipairs(edit.documentChanges or {}) do
    local document = change.textDocument
    if document then
      local version = document.version ~= vim.NIL and document.version or nil
      documents[#documents + 1] = { uri = document.uri, version = version, edits = change.edits }
    else
      notes[#notes + 1] = ('# %s %s'):format(change.kind, change.uri or change.oldUri)
    end
  end
  for uri, edits in pairs(edit.changes or {}) do
    documents[#documents + 1] = { uri = uri, edits = edits }
  end
  return documents, notes
end

--- Unified diff of the document of {doc} against the same text with its edits applied (on a scratch
--- copy, by Neovim's own apply_text_edits); empty when the edits change nothing.
---@param doc llada.DocumentEdit
---@param encoding string
---@return string[]
local function diff_lines(doc, encoding)
  local bufnr = vim.uri_to_bufnr(doc.uri)
  vim.fn.bufload(bufnr)
  local old = api.nvim_buf_get_lines(bufnr, 0, -1, false)
  local scratch = api.nvim_create_buf(false, true)
  api.nvim_buf_set_lines(scratch, 0, -1, false, old)
  vim.lsp.util.apply_text_edits(vim.deepcopy(doc.edits), scratch, encoding)
  local new = api.nvim_buf_get_lines(scratch, 0, -1, false)
  api.nvim_buf_delete(scratch, { force = true })
  local diff = (vim.text.diff or vim.diff)(table.concat(old, '\n') .. '\n', table.concat(new, '\n') .. '\n')
  ---@cast diff string
  if diff == '' then
    return {}
  end
  local name = vim.fn.fnamemodify(vim.uri_to_fname(doc.uri), ':~:.')
  local lines = { '--- ' .. name, '+++ ' .. name .. ' (proposed)' }
  vim.list_extend(lines, vim.split(diff, '\n', { plain = true, trimempty = true }))
  return lines
end

--- Shows {lines} as a diff in a float over the editor, without entering it; returns its window.
---@param lines string[]
---@param title string
---@return integer
local function open_float(lines, title)
  local buf = api.nvim_create_buf(false, true)
  api.nvim_buf_set_lines(buf, 0, -1, false, lines)
  vim.bo[buf].filetype = 'diff'
  vim.bo[buf].modifiable = false
  vim.bo[buf].bufhidden = 'wipe'
  local width = 20
  for _, line in ipairs(lines) do
    width = math.max(width, api.nvim_strwidth(line))
  end
  width = math.min(width, vim.o.columns - 4)
  local height = math.max(1, math.min(#lines, vim.o.lines - vim.o.cmdheight - 8))
  return api.nvim_open_win(buf, false, {
    relative = 'editor',
    row = math.floor((vim.o.lines - height) / 2) - 2,
    col = math.floor((vim.o.columns - width) / 2),
    width = width,
    height = height,
    style = 'minimal',
    border = 'rounded',
    title = ' ' .. title .. ' ',
    title_pos = 'center',
  })
end

--- Shows {edit} as a diff and asks with |vim.ui.select()| whether to apply it. Calls {on_done} with
--- nil to apply it, else the reason not to: the user discarded it, or it changes nothing (not asked).
---@param edit lsp.WorkspaceEdit
---@param encoding string
---@param title string
---@param on_done fun(reason?: string)
function M.ask(edit, encoding, title, on_done)
  local documents, lines = document_edits(edit)
  for _, doc in ipairs(documents) do
    vim.list_extend(lines, diff_lines(doc, encoding))
  end
  if #lines == 0 then
    on_done(M.UNCHANGED)
    return
  end
  local win = open_float(lines, title)
  -- The default vim.ui.select() is inputlist(), which blocks before the next redraw: without one now,
  -- the user would be asked about a float that is not on screen yet.
  vim.cmd.redraw()
  vim.ui.select({ 'Apply', 'Discard' }, { prompt = title .. ': apply this change?' }, function(choice)
    if api.nvim_win_is_valid(win) then
      api.nvim_win_close(win, true)
    end
    -- Clears inputlist()'s lines too: the messages after the choice then need no hit-enter prompt.
    vim.cmd.redraw()
    on_done(choice ~= 'Apply' and M.DISCARDED or nil)
  end)
end

--- The first document of {edit} that moved past the version the edit was made for, if any.
---@param edit lsp.WorkspaceEdit
---@return string? uri
local function moved_on(edit)
  for _, doc in ipairs((document_edits(edit))) do
    local bufnr = vim.uri_to_bufnr(doc.uri)
    local current = vim.lsp.util.buf_versions[bufnr]
    if doc.version and current and current > doc.version then
      return doc.uri
    end
  end
end

--- workspace/applyEdit handler that asks first: the server's request waits for the answer (server
--- requests are handled in a coroutine), then Neovim's own handler applies the edit. A document that
--- changed meanwhile is left alone: Neovim's handler would apply the edit to a document at version 0,
--- and skip it at later versions yet answer applied.
---@param err? lsp.ResponseError
---@param params lsp.ApplyWorkspaceEditParams
---@param ctx lsp.HandlerContext
---@return lsp.ApplyWorkspaceEditResult
function M.apply_edit(err, params, ctx)
  local client = vim.lsp.get_client_by_id(ctx.client_id)
  local co, is_main = coroutine.running()
  if not client or not co or is_main then
    return { applied = false, failureReason = 'The editor cannot wait for a review here.' }
  end
  local answered, reason, waiting = false, nil, false
  M.ask(params.edit, client.offset_encoding, params.label or client.name, function(r)
    answered, reason = true, r
    if waiting then
      assert(coroutine.resume(co))
    end
  end)
  if not answered then
    waiting = true
    coroutine.yield()
  end
  if not reason and moved_on(params.edit) then
    reason = M.MOVED_ON
  end
  if reason then
    return { applied = false, failureReason = reason }
  end
  return vim.lsp.handlers['workspace/applyEdit'](err, params, ctx)
end

return M
