--- Typing through a suggestion: what is left of the ghost text once the user has typed the start of
--- it, so it stays on screen (trimmed) until the revised answer replaces it, and the text the built-in
--- completer shows at the cursor, which the accept key takes as shown. Knows nothing of requests.
local api = vim.api

local M = {}

local builtin_ns = api.nvim_create_namespace('nvim.lsp.inline_completion')

--- The rest of {item} ({text} shown at {row}, {col} when the line read {line}) now that the line reads
--- {now} and the cursor is at {cursor} (0-based row, byte col): the typed text must be exactly the start
--- of the suggestion, inserted at its place, with some of it left. nil otherwise (moved, edited, typed
--- something else, or typed all of it).
---@param item {text: string, row: integer, col: integer, line: string}
---@param now string
---@param cursor [integer, integer]
---@return string?
function M.rest(item, now, cursor)
  local row, col = cursor[1], cursor[2]
  if row ~= item.row or col < item.col or not item.line then
    return nil
  end
  local typed = now:sub(item.col + 1, col)
  if now ~= item.line:sub(1, item.col) .. typed .. item.line:sub(item.col + 1) then
    return nil
  end
  if #typed >= #item.text or item.text:sub(1, #typed) ~= typed then
    return nil
  end
  return item.text:sub(#typed + 1)
end

--- The text the built-in completer shows on the cursor's line of {win}, at or after the cursor, as it
--- draws it (already trimmed by what was typed since its answer, and by the characters after its place
--- that the text starts with), and where: nil when it shows nothing there.
---@param bufnr integer
---@param win integer
---@return {row: integer, col: integer, text: string}? row 0-based, col a byte column
function M.builtin_shown(bufnr, win)
  local cursor = api.nvim_win_get_cursor(win)
  local mark = api.nvim_buf_get_extmarks(bufnr, builtin_ns, 0, -1, { details = true })[1]
  if not mark or mark[2] ~= cursor[1] - 1 or mark[3] < cursor[2] then
    return nil
  end
  local function join(chunks)
    local parts = {}
    for _, chunk in ipairs(chunks or {}) do
      if chunk[2] == 'ComplHint' then -- not the "(1/2)" hint
        parts[#parts + 1] = chunk[1]
      end
    end
    return table.concat(parts)
  end
  local lines = { join(mark[4].virt_text) }
  for _, virt_line in ipairs(mark[4].virt_lines or {}) do
    lines[#lines + 1] = join(virt_line)
  end
  local text = table.concat(lines, '\n')
  return text ~= '' and { row = mark[2], col = mark[3], text = text } or nil
end

--- Inserts {text} at the cursor {cursor} of {win} in {bufnr} and moves the cursor past it.
---@param bufnr integer
---@param win integer
---@param cursor [integer, integer] (1-based row, byte col)
---@param text string
---@return integer row, integer col the end of the inserted text (0-based row, byte col)
function M.insert(bufnr, win, cursor, text)
  local lines = vim.split(text, '\n', { plain = true })
  local row, col = cursor[1] - 1, cursor[2]
  api.nvim_buf_set_text(bufnr, row, col, row, col, lines)
  local end_row, end_col = row + #lines - 1, (#lines == 1 and col or 0) + #lines[#lines]
  if api.nvim_win_is_valid(win) and api.nvim_win_get_buf(win) == bufnr then
    api.nvim_win_set_cursor(win, { end_row + 1, end_col })
  end
  return end_row, end_col
end

return M
