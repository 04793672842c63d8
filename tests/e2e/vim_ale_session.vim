" One Vim session with ALE against llada-lsp, driven by timers (test_vim_ale.py runs it in a pty).
" Reads $LLADA_VIM_SERVER (the server's command), $LLADA_VIM_OUT (where the JSON result goes),
" $LLADA_VIM_COMPLETE ("LINE:COL", insert mode at that column, 1-based, after the typed word),
" $LLADA_VIM_REWRITE ("L1:L2", the lines the code action rewrites) and $LLADA_VIM_WAIT (seconds).
set nocompatible
set nomore shortmess+=I
set columns=160 lines=40
let g:ale_completion_enabled = 1
let g:ale_linters_explicit = 1
let g:ale_linters = {'python': ['llada']}
let g:ale_fixers = {}
let g:ale_echo_cursor = 0
let g:ale_virtualtext_cursor = 'disabled'
packadd! ale
filetype plugin on
syntax off

let g:R = {'events': [], 'items': []}
let s:t0 = reltime()
function! s:Note(what) abort
  call add(g:R.events, printf('%.1f %s', reltimefloat(reltime(s:t0)), a:what))
  " so far, should Vim never finish
  call writefile([json_encode(g:R)], $LLADA_VIM_OUT)
endfunction

function! s:Root(buffer) abort
  return fnamemodify(bufname(a:buffer), ':p:h')
endfunction
call ale#linter#Define('python', {
\   'name': 'llada',
\   'lsp': 'stdio',
\   'executable': 'sh',
\   'command': $LLADA_VIM_SERVER,
\   'project_root': function('s:Root'),
\})

function! s:Finish(why) abort
  let g:R.finish = a:why
  let g:R.screen = s:Screen()
  let g:R.buffer = getline(1, '$')
  let g:R.messages = execute('messages')
  call writefile([json_encode(g:R)], $LLADA_VIM_OUT)
  qall!
endfunction

function! s:Screen() abort
  let l:rows = []
  for l:row in range(1, &lines)
    let l:text = ''
    for l:col in range(1, &columns)
      let l:text .= screenstring(l:row, l:col)
    endfor
    call add(l:rows, substitute(l:text, '\s\+$', '', ''))
  endfor
  return l:rows
endfunction

let s:deadline = str2float($LLADA_VIM_WAIT)
let [s:line, s:col] = map(split($LLADA_VIM_COMPLETE, ':'), 'str2nr(v:val)')
let [s:first, s:last] = map(split($LLADA_VIM_REWRITE, ':'), 'str2nr(v:val)')
let s:state = 'start'
let s:asked = -100.0

" Completion: in insert mode after the typed word, ask (as <Plug>(ale_complete) does) until the menu
" shows ALE's items (the model may still be loading: the server then answers with nothing), accept the
" first with CTRL-Y, and read the line once ALE has applied the item's additional edits.
function! s:Step(timer) abort
  try
    call s:Advance()
  catch
    call s:Note('error in state ' . s:state . ': ' . v:exception . ' at ' . v:throwpoint)
    call s:Finish('error')
  endtry
endfunction

function! s:Advance() abort
  if reltimefloat(reltime(s:t0)) > s:deadline
    call s:Note('timed out in state ' . s:state)
    call s:Finish('timeout')
    return
  endif
  if s:state is# 'start'
    call cursor(s:line, s:col)
    call feedkeys('a', 'nt')
    let s:state = 'ask'
  elseif s:state is# 'ask'
    if mode() isnot# 'i'
      return
    endif
    if pumvisible()
      let l:info = complete_info(['items', 'selected'])
      let g:R.items = map(copy(l:info.items), '{"word": v:val.word, "menu": v:val.menu}')
      call s:Note('menu: ' . json_encode(g:R.items))
      call feedkeys(l:info.selected < 0 ? "\<C-n>\<C-y>" : "\<C-y>", 'nt')
      let s:state = 'accepted'
    elseif !exists('b:ale_completion_result') && reltimefloat(reltime(s:t0)) - s:asked < 60
      " asked, not answered yet: a new ask would supersede it (the server cancels the older)
      return
    elseif reltimefloat(reltime(s:t0)) - s:asked > 1.0
      " ALE sets b:ale_completion_result when an answer arrives, and opens its menu if it is not empty
      if exists('b:ale_completion_result') && !empty(b:ale_completion_result)
        return
      endif
      unlet! b:ale_completion_result
      let s:asked = reltimefloat(reltime(s:t0))
      call s:Note('asked')
      call feedkeys("\<Plug>(ale_complete)", 'mt')
    endif
  elseif s:state is# 'accepted'
    if pumvisible()
      return
    endif
    let g:R.completed_line = getline(s:line)
    call s:Note('completed: ' . g:R.completed_line)
    call feedkeys("\<Esc>", 'nt')
    let s:state = 'rewrite'
  elseif s:state is# 'rewrite'
    if mode() isnot# 'n'
      return
    endif
    let g:R.before_rewrite = getline(1, '$')
    " The lines selected (V), then :'<,'>ALECodeAction, as a user asks; its menu is an input() prompt.
    call feedkeys(printf("%dGV%dG\<Esc>:'<,'>ALECodeAction\<CR>", s:first, s:last), 'nt')
    let s:state = 'menu'
  elseif s:state is# 'menu'
    if mode() is# 'c' && getcmdtype() is# '@'
      call s:Note('code action menu shown')
      call feedkeys("1\<CR>", 'nt')
      let s:state = 'outcome'
    endif
  elseif s:state is# 'outcome'
    let l:screen = join(s:Screen(), "\n")
    if getline(1, '$') != g:R.before_rewrite || l:screen =~# 'rewrite'
      call s:Note('outcome seen')
      " what the screen shows then, not later: the message may be an echo
      call s:Finish('done')
    endif
  endif
endfunction

autocmd VimEnter * call timer_start(200, function('s:Step'), {'repeat': -1})
