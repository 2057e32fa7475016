import { memo, useRef, useState } from 'react';
import ReactMarkdown from 'react-markdown';
import rehypeHighlight from 'rehype-highlight';
import remarkGfm from 'remark-gfm';

// Markdown as it streams: each update re-renders the text so far, so an unclosed code block or a
// half-written table shows as one while it arrives. Raw HTML in model output is never rendered.
// A code block with its language and a Copy button above the code (never over it), and the code
// coloured by highlight.js, bundled into the page.
function languageOf(node) {
  const code = node?.children?.find(child => child.tagName === 'code');
  const classes = code?.properties?.className ?? [];
  const named = classes.find(name => String(name).startsWith('language-'));
  return named ? String(named).slice('language-'.length) : '';
}

function CodeBlock({ node, ...props }) {
  const block = useRef(null);
  const [copied, setCopied] = useState(false);
  async function copy() {
    try {
      await navigator.clipboard.writeText(block.current?.innerText ?? '');
      setCopied(true);
      setTimeout(() => setCopied(false), 1500);
    } catch {
      setCopied(false);
    }
  }
  return (
    <div className="code-block">
      <div className="code-header">
        <span className="code-language">{languageOf(node) || 'code'}</span>
        <button type="button" className="small copy-code" onClick={copy} aria-label="Copy the code">
          {copied ? 'Copied' : 'Copy'}
        </button>
      </div>
      <pre ref={block} {...props} />
    </div>
  );
}

// highlight.js's common languages (Python, JavaScript, SQL, shell, JSON, …); a block in another language,
// or with none named, shows uncoloured.
const rehypePlugins = [[rehypeHighlight, { detect: false }]];

const components = {
  pre: CodeBlock,
  a: ({ node, ...props }) => <a {...props} target="_blank" rel="noopener noreferrer nofollow" />,
  table: ({ node, ...props }) => (
    <div className="table-scroll">
      <table {...props} />
    </div>
  ),
};

function Markdown({ text }) {
  return (
    <div className="markdown">
      <ReactMarkdown remarkPlugins={[remarkGfm]} rehypePlugins={rehypePlugins} components={components}>
        {text}
      </ReactMarkdown>
    </div>
  );
}

export default memo(Markdown);
